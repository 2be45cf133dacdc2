"""edgeplug.quantize with QnnQuantizer on gemma-block: the (1 + w) norms recomposed and folded first, each
annotated whole by QNN's quantizer (the core's part of edgeplug.quantize and `lower --quantize`, on a test
scheme: tests/test_quantize.py)."""

from __future__ import annotations

import pytest
import torch

import edgeplug
from edgeplug.examples import load_model

aten = torch.ops.aten


def _targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.fixture(scope="session")
def gemma_qnn():
    model, inputs, _, _ = load_model("gemma-block")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lines: list[str] = []
    gm = edgeplug.quantize(model, inputs, "qnn", "8a8w", progress=lines.append)
    return model, inputs, before, gm, lines


def test_quantize_recomposes_gemma_norms_before_annotation(gemma_qnn):
    model, inputs, _, gm, _ = gemma_qnn
    assert isinstance(gm, edgeplug.QuantizedModel) and isinstance(gm.program, torch.fx.GraphModule)
    info = gm.quantization
    assert (info.backend, info.scheme, info.activation_bits, info.weight_bits) == ("qnn", "8a8w", 8, 8)
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
    assert (quantized - reference).abs().max() < 0.5  # 8-bit logits of magnitude ~3.5; -inf masks gave 3.5


def test_quantize_leaves_the_model_as_it_was_and_says_what_it_does(gemma_qnn):
    model, _, before, gm, lines = gemma_qnn
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    stages = [s for s, _ in gm.quantization.stages]
    assert stages == ["export", "export passes", "recompose norms", "fold constants", "build quantizer", "prepare", "calibrate", "convert"]
    assert lines[0] == "[qnn] quantize 8a8w: export ..." and len(lines) == len(stages)
