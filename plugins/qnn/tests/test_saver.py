"""QNN's saver mode (``EDGEPLUG_QNN_SAVER=1``): every partition through Qualcomm's QNN interface.

The lowerings need the QNN libraries (``QNN_SDK_ROOT`` laid out as
``.ci/qnn_saver.sh`` does it, its library folder on ``LD_LIBRARY_PATH``); they
skip, saying why, where those do not load, and fail instead of skipping under
``EDGEPLUG_QNN_SAVER_REQUIRED=1`` (the CI job that lays them out). The
comparison with ExecuTorch's own QNN flow is bench/qnn_saver.py's, so the
table it prints and these assertions read the same numbers.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

import edgeplug
from edgeplug_qnn import saver

REQUIRED_VAR = "EDGEPLUG_QNN_SAVER_REQUIRED"
BENCH = Path(__file__).resolve().parents[3] / "bench" / "qnn_saver.py"
MODELS = ("llama", "gemma3", "qwen3")


def _bench():
    name = "edgeplug_bench_qnn_saver"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def bench():
    """bench/qnn_saver.py, once QNN's saver is known to load here."""
    module = _bench()
    with module.saver_mode():
        available = saver.availability()
    if not available.ok:
        why = f"QNN's saver cannot run here: {available.reason}. {available.hint}"
        if os.environ.get(REQUIRED_VAR, "") not in ("", "0"):
            pytest.fail(f"{REQUIRED_VAR} is set and {why}", pytrace=False)
        pytest.skip(why)
    return module


@pytest.fixture(scope="session")
def comparisons(bench):
    """Each model lowered by edgeplug (saver mode) and by ExecuTorch's QNN flow (1-layer decoders)."""
    return {name: bench.compare(name, layers=1) for name in MODELS}


@pytest.mark.parametrize("model", MODELS)
def test_every_partition_goes_through_qnn_and_every_norm_is_an_rms_norm_qnn_built(comparisons, model):
    c = comparisons[model]
    ours = c.edgeplug
    assert not ours.error, ours.error
    assert ours.ok and ours.partitions >= 1  # one saver record per partition
    assert ours.finalized == ours.partitions  # QNN finalized every partition's graph
    assert c.norms > 0
    # every norm fused, delegated, and built by QNN's RmsNorm op builder
    assert ours.rms_norm_delegated == ours.rms_norm_recorded == c.norms


@pytest.mark.parametrize("model", MODELS)
def test_no_more_partitions_or_cpu_nodes_than_executorchs_own_qnn_flow(comparisons, model):
    c = comparisons[model]
    ours, stock = c.edgeplug, c.stock
    assert ours.ok, ours.error
    if stock.error:  # gemma3: executorch's own RMSNorm fusion makes a node its LayoutTransform rejects
        assert model == "gemma3", f"stock QNN failed on {model}: {stock.error}"
        return
    assert stock.ok and stock.finalized == stock.partitions
    assert ours.partitions <= stock.partitions and ours.cpu_nodes <= stock.cpu_nodes, (
        f"edgeplug: {ours.partitions} partitions, CPU {ours.cpu_ops}; stock: {stock.partitions}, CPU {stock.cpu_ops}"
    )


@pytest.fixture(scope="session")
def llama_saver_lowering(bench):
    model, inputs = bench.build("llama")
    with bench.saver_mode():
        return edgeplug.lower(model, inputs, "qnn", model_name="llama")


def test_the_delegates_hold_a_stand_in_payload_not_a_context_binary(llama_saver_lowering):
    result = llama_saver_lowering
    records = saver.lowered_records(result.edge.exported_program())
    assert len(records) == len(result.report.partitions) == 1
    (record,) = records
    assert record.ops["RmsNorm"] == 5 and record.finalized
    recorded = Path(record.calls_file).read_text()
    assert recorded.count('"RmsNorm"') == 5 and "graphFinalize" in recorded
    # what a .pte of this lowering holds: the stand-in, which names itself
    assert saver.PAYLOAD_MAGIC in result.buffer
    with pytest.raises(ValueError, match="not a QNN saver stand-in payload"):
        saver.SaverRecord.from_payload(b"\x00QNN context binary")


def test_a_saver_lowering_is_saved_only_as_a_stand_in(llama_saver_lowering, tmp_path):
    report = llama_saver_lowering.report
    assert report.dry_run and report.stand_in.kind == "backend" and report.stand_in.delegates == 1
    assert report.stand_in.reason in report.notes and Path(report.stand_in.recording).is_dir()
    with pytest.raises(edgeplug.EdgeplugError, match=r"not saving .*q\.pte: QNN saver mode .* Pass stand_in=True"):
        llama_saver_lowering.save(tmp_path / "q.pte")
    assert list(tmp_path.iterdir()) == []
    written = llama_saver_lowering.save(tmp_path / "q.pte", stand_in=True)
    assert written == tmp_path / "q.stand-in.pte" and saver.PAYLOAD_MAGIC in written.read_bytes()
    assert report.stand_in.written == str(written) and not (tmp_path / "q.pte").exists()


def test_the_patch_of_qnn_preprocess_is_undone_after_the_lowering_and_after_an_error(llama_saver_lowering):
    from executorch.backends.qualcomm.qnn_preprocess import QnnBackend
    from executorch.backends.qualcomm.utils.utils import generate_htp_compiler_spec, generate_qnn_executorch_compiler_spec

    from edgeplug_qnn import support

    upstream = QnnBackend.__dict__["preprocess_multimethod"]
    device_specs = generate_qnn_executorch_compiler_spec(
        soc_model=support.soc(), backend_options=generate_htp_compiler_spec(use_fp16=True)
    )
    with pytest.raises(RuntimeError, match="without saver=True"):
        with saver.per_partition_saver(saver.compile_specs(support.soc())):
            assert QnnBackend.__dict__["preprocess_multimethod"] is not upstream
            # a partition with device compile specs is refused before QNN is asked anything
            QnnBackend.preprocess_multimethod({"forward": [None]}, {"forward": [device_specs]})
    assert QnnBackend.__dict__["preprocess_multimethod"] is upstream


def test_saver_mode_names_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.setenv(saver.MODE_VAR, "1")
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    qnn = edgeplug.get_backend("qnn")
    a = qnn.availability()
    assert not a.ok and a.reason == "EDGEPLUG_QNN_SAVER is set but QNN_SDK_ROOT is not"
    assert "onnxruntime-qnn" in a.hint and "LD_LIBRARY_PATH" in a.hint
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path))
    a = qnn.availability()
    assert not a.ok and "lib/x86_64-linux-clang/libQnnSaver.so" in a.reason
    libs = tmp_path / "lib" / "x86_64-linux-clang"
    libs.mkdir(parents=True)
    for name in saver.LIBRARIES:  # there (empty), but what loads by name is not these
        (libs / name).write_bytes(b"")
    a = qnn.availability()
    # without the libraries on the loader path: they do not load; in the saver CI job: another folder's do
    assert not a.ok and a.reason.startswith("libQnnSaver.so ") and str(libs) in a.reason, a.reason
    monkeypatch.setenv(saver.MODE_VAR, "0")  # off: the SDK check of the device path again
    assert "libQnnHtp.so" in qnn.availability().reason
