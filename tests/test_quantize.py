"""edgeplug.quantize and `lower --quantize`: the backend's own quantizer, norms recomposed first.

The backend is fixture-keep (an RMSNorm policy that keeps aten.rms_norm); its scheme ``8a8w`` is the
test scheme of tests/fixtures/backends/edgeplug_fixture_quant.py: a small torchao PT2E quantizer that
annotates linears and each aten.rms_norm whole, as a backend that runs norms natively would.
"""

from __future__ import annotations

import json

import pytest
import torch

import edgeplug
from edgeplug._quantize.quantize import QuantizationError
from edgeplug._quantize.program import output_steps
from edgeplug.examples import load_model

aten = torch.ops.aten
BACKEND = "fixture-keep"


@pytest.fixture(scope="module", autouse=True)
def scheme():
    import edgeplug_fixture_quant

    with edgeplug_fixture_quant.registered():
        yield


def _targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.fixture(scope="module")
def gemma(scheme):
    model, inputs, _, _ = load_model("gemma-block")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lines: list[str] = []
    gm = edgeplug.quantize(model, inputs, BACKEND, "8a8w", progress=lines.append)
    return model, inputs, before, gm, lines


def test_quantize_recomposes_gemma_norms_before_annotation(gemma):
    model, inputs, _, gm, _ = gemma
    assert isinstance(gm, edgeplug.QuantizedModel) and isinstance(gm.program, torch.fx.GraphModule)
    info = gm.quantization
    assert (info.backend, info.scheme, info.activation_bits, info.weight_bits) == (BACKEND, "8a8w", 8, 8)
    # Gemma's (1 + w) folded: each of the 3 norms became one aten.rms_norm the quantizer annotated whole
    assert [r.outcome for r in info.fusions] == ["folded_weight"] * 3
    targets = _targets(gm.program)
    assert targets.count(aten.rms_norm.default) == 3
    assert aten.rsqrt.default not in targets and aten.pow.Tensor_Scalar not in targets
    for n in gm.program.graph.nodes:
        if n.target == aten.rms_norm.default:  # its input and output are quantized, nothing inside it is
            assert "dequantize_per_tensor" in str(n.args[0].target)
            assert all("quantize_per_tensor" in str(u.target) for u in n.users)
    with torch.no_grad():
        quantized, reference = gm(*inputs), model(*inputs)
    assert (quantized - reference).abs().max() < 0.5  # 8-bit logits of magnitude ~3.5


def test_quantize_leaves_the_model_as_it_was_and_says_what_it_does(gemma):
    model, _, before, gm, lines = gemma
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    stages = [s for s, _ in gm.quantization.stages]
    assert stages == ["export", "export passes", "recompose norms", "fold constants", "build quantizer", "prepare", "calibrate", "convert"]
    assert lines[0] == f"[{BACKEND}] quantize 8a8w: export ..." and len(lines) == len(stages)


def test_calibration_data_sets_the_ranges():
    model, (x,), _, _ = load_model("mlp")
    default = edgeplug.quantize(model, (x,), BACKEND, "8a8w")
    wide = edgeplug.quantize(model, (x,), BACKEND, "8a8w", calibration=[(x,), (4 * x,), [8 * x]])
    assert default.quantization.calibration_batches == 1
    assert wide.quantization.calibration_batches == 3
    (step,), (wide_step,) = output_steps(default), output_steps(wide)
    assert wide_step > 3 * step  # the observers saw the larger inputs
    with pytest.raises(QuantizationError, match="calibration data is empty"):
        edgeplug.quantize(model, (x,), BACKEND, "8a8w", calibration=[])


def test_unknown_scheme_fails_before_any_work():
    model, inputs, _, _ = load_model("mlp")
    lines: list[str] = []
    with pytest.raises(QuantizationError, match=rf"backend '{BACKEND}' has no quantization scheme '16a8w'.*8a8w"):
        edgeplug.quantize(model, inputs, BACKEND, "16a8w", progress=lines.append)
    assert lines == []  # not even the export started


# -- the command line ---------------------------------------------------------------------


def test_cli_quantizes_before_lowering_and_reports_it(cli, tmp_path):
    report = tmp_path / "r.json"
    code, out, err = cli("lower", "mlp", "--backend", BACKEND, "--quantize", "8a8w", "--dry-run", "--report", report)
    assert code == 0, err
    assert f"[{BACKEND}] quantize 8a8w: prepare ..." in err  # progress, like the other stages
    assert f"quantization: {BACKEND} 8a8w (8-bit activations, 8-bit per-channel weights; 1 calibration batch)" in out
    data = json.loads(report.read_text())
    assert data["quantization"]["quantizer_backend"] == BACKEND and data["quantization"]["scheme"] == "8a8w"
    stages = [s["stage"] for s in data["stages"]]
    assert stages[:2] == ["quantize: export", "quantize: export passes"] and "quantize: convert" in stages
    assert stages.index("quantize: convert") < stages.index("to_edge")
    assert "quantized_decomposed.quantize_per_tensor.default" in json.dumps(data["partitions"]) + json.dumps(data["cpu_ops"])


def test_cli_calibration_file(cli, tmp_path):
    calib = tmp_path / "calib.py"
    calib.write_text(
        "import torch\n\n"
        "def batches():\n"
        "    g = torch.Generator().manual_seed(0)\n"
        "    return [(torch.randn(2, 32, generator=g),) for _ in range(3)]\n"
    )
    report = tmp_path / "r.json"
    code, _, err = cli(
        "lower", "mlp", "-b", BACKEND, "--quantize", "8a8w", "--calibration", f"{calib}:batches", "--dry-run",
        "--report", report,
    )
    assert code == 0, err
    assert json.loads(report.read_text())["quantization"]["calibration_batches"] == 3
    code, _, err = cli("lower", "mlp", "-b", BACKEND, "--quantize", "8a8w", "--calibration", f"{calib}:nothing", "--dry-run")
    assert code == 2 and "has no 'nothing'" in err


def test_cli_quantize_errors_are_clear(cli):
    code, _, err = cli("lower", "mlp", "-b", BACKEND, "--quantize", "w4", "--dry-run")
    assert code == 2
    assert f"backend '{BACKEND}' has no quantization scheme 'w4'" in err and "8a8w" in err
    assert "export" not in err and len(err.strip().splitlines()) == 1, err  # refused before the model runs
    code, _, err = cli("lower", "mlp", "-b", BACKEND, "--calibration", "x.py:y", "--dry-run")
    assert code == 2 and "--calibration needs --quantize" in err
