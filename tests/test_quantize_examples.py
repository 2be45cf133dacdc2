"""Every built-in example quantizes under every scheme of every backend, norms recomposed first."""

from __future__ import annotations

import pytest
import torch

import edgeplug
from edgeplug.examples import EXAMPLES, load_model
from edgeplug._quantization import schemes

#: norms per example (two per block, and the final one)
NORMS = {"llama": 5, "gemma-block": 3, "mlp": 0}
#: backends whose fusion policy recomposes norms before annotation (xnnpack declares none)
RECOMPOSED = {"qnn", "samsung", "vulkan", "webgpu"}
#: the PT2E schemes (quantize takes the exported program); torchao source transforms need the module and
#: are tested with their plugins (plugins/xnnpack/tests/test_quantize_decoders.py, plugins/vulkan/tests)
CASES = [(b, s.scheme) for b in ("qnn", "samsung", "xnnpack", "vulkan", "webgpu") for s in schemes(b) if s.kind == "pt2e"]


@pytest.fixture(scope="session")
def exported_examples():
    """Each example exported once; edgeplug.quantize takes the program as it is."""
    out = {}
    for name in sorted(EXAMPLES):
        model, inputs, _, _ = load_model(name)
        with torch.no_grad():
            reference = model(*inputs)
        out[name] = (torch.export.export(model, inputs), inputs, reference)
    return out


def test_examples_are_finite_everywhere():
    for name in sorted(EXAMPLES):
        model, _, _, _ = load_model(name)
        for key, t in model.state_dict().items():
            assert torch.isfinite(t).all(), f"{name}: {key} holds a non-finite value, which no quantizer can observe"


@pytest.mark.parametrize("example", sorted(EXAMPLES))
@pytest.mark.parametrize("backend,scheme", CASES)
def test_example_quantizes(exported_examples, example, backend, scheme):
    ep, inputs, reference = exported_examples[example]
    gm = edgeplug.quantize(ep, inputs, backend, scheme)
    info = gm.quantization
    targets = [str(n.target) for n in gm.program.graph.nodes if n.op == "call_function"]
    weight_only = info.activation_bits is None
    if weight_only:  # linear weights only: dequantized per channel, activations stay float
        assert any("dequantize_per_channel" in t for t in targets)
        assert not any("quantize_per_tensor" in t for t in targets)
    else:
        assert any(".quantize_per_tensor." in t for t in targets)
    expected = NORMS[example] if backend in RECOMPOSED else 0
    assert len(info.fusions) == expected
    assert all(r.outcome in ("fused", "folded_weight") for r in info.fusions), [r.reason for r in info.fusions]
    with torch.no_grad():
        out = gm(*inputs)
    assert torch.isfinite(out).all()
    # quantization error, not a broken program: within a fraction of the output's range
    bound = (0.45 if info.weight_bits == 4 else 0.2) * reference.abs().max().item()
    err = (out - reference).abs().max().item()
    assert err < bound, f"{example} {backend} {scheme}: |quantized - float| = {err:.3f}"
