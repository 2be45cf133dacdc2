"""External weights on XNNPACK (issue 27): ``lower(..., external_weights=True)`` writes the weights once into a
``.ptd`` beside the ``.pte`` through executorch's named data, and the pair runs in executorch's runtime; the
caller's weights are shared, never copied; the per-stage memory profile of a full lowering. The refusals and
the dry-run checks are the core's tests (tests/test_lower_memory.py)."""

from __future__ import annotations

import pytest
import torch

import edgeplug
from edgeplug.examples.llama import tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def decoder():
    return tiny_llama()


@pytest.fixture(scope="module")
def external(decoder):
    model, args = decoder
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = edgeplug.lower(model, args, "xnnpack", external_weights=True, verify=True, profile_memory=True)
    return result, before


def _param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_weights_go_to_a_ptd_and_the_pair_runs_in_executorchs_runtime(decoder, external, tmp_path):
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    model, args = decoder
    result, _ = external
    assert result.report.verification.passed, result.report.verification.failures()
    pte = result.save(tmp_path / "decoder.pte")
    ptd = tmp_path / "decoder.ptd"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decoder.ptd", "decoder.pte"]
    weights = _param_bytes(model)
    # every weight is in the .ptd once (delegated and CPU ones alike: the embedding stays on the CPU)
    assert weights <= ptd.stat().st_size < 1.2 * weights
    assert pte.stat().st_size < 0.1 * weights
    assert result.report.output_bytes == pte.stat().st_size
    out = _load_for_executorch(str(pte), data_path=str(ptd)).forward(list(args))[0]
    assert torch.allclose(out, model(*args), atol=1e-4)
    with pytest.raises(RuntimeError):  # the .pte alone has no weights
        _load_for_executorch(str(pte)).forward(list(args))


def test_the_callers_model_is_unchanged_and_its_weights_shared(decoder, external):
    model, _ = decoder
    result, before = external
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.requires_grad for p in model.parameters())  # the caller's flags stay as they were
    mine = {p.untyped_storage().data_ptr() for p in model.parameters()}
    ep = result.exported_program
    lowered = {ep.state_dict[n].untyped_storage().data_ptr() for n in ep.graph_signature.parameters}
    assert lowered
    assert lowered <= mine, "the exported program holds copies of the caller's weights"


def test_profile_memory_puts_each_stages_peak_in_the_report(external):
    result, _ = external
    stages = {s.stage: s.peak_rss_mib for s in result.report.stages}
    assert {"export", "to_edge", "partition + delegate", "serialize .pte", "verify"} <= set(stages)
    assert all(isinstance(v, float) and v > 0 for v in stages.values()), stages
    assert "MiB peak" in result.report.to_table()


def test_external_weights_cannot_stream_to_stdout(external):
    result, _ = external
    with pytest.raises(edgeplug.EdgeplugError, match="two files"):
        result.save("-")


@pytest.mark.slow
def test_cli_writes_the_pte_and_its_ptd_and_profiles_memory(edgeplug_cli, tmp_path):
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    out = tmp_path / "mlp.pte"
    code, stdout, stderr = edgeplug_cli(
        "lower", "mlp", "-b", "xnnpack", "--external-weights", "--profile-memory", "--verify", "-o", out
    )
    assert code == 0, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.ptd", "mlp.pte"]
    assert "MiB peak" in stdout
    from edgeplug.examples import load_model

    model, args, _, _ = load_model("mlp")
    got = _load_for_executorch(str(out), data_path=str(tmp_path / "mlp.ptd")).forward(list(args))[0]
    assert torch.allclose(got, model(*args), atol=1e-5)
