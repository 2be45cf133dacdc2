"""Every built-in example quantizes under every PT2E scheme of every installed backend, norms recomposed first.

The backends and schemes are whatever is installed (``edgeplug.backends()``, each
backend's ``QuantScheme`` records): this file names none. ``make test`` runs the
first PT2E scheme of each backend on the llama example; the whole matrix (every
example x every scheme) runs with ``EDGEPLUG_ZOO=1`` (``make zoo``).
"""

from __future__ import annotations

import os

import pytest
import torch

import edgeplug
from edgeplug.examples import EXAMPLES, load_model
from edgeplug._quantize.quantize import schemes

#: norms per example (two per block, and the final one)
NORMS = {"llama": 5, "gemma-block": 3, "mlp": 0}
WHOLE_SET = os.environ.get("EDGEPLUG_ZOO") == "1"


def _cases():
    """(example, backend, scheme) for the PT2E schemes (quantize takes the exported program); torchao
    source transforms need the module and are tested with their plugins."""
    for backend in edgeplug.backends():
        pt2e = [s.scheme for s in schemes(edgeplug.get_backend(backend)) if s.kind == "pt2e"]
        for i, scheme in enumerate(pt2e):
            for example in sorted(EXAMPLES):
                marks = []
                if not WHOLE_SET and (i > 0 or example != "llama"):
                    marks.append(pytest.mark.skip(reason="the whole matrix runs with EDGEPLUG_ZOO=1 (`make zoo`)"))
                yield pytest.param(example, backend, scheme, marks=marks, id=f"{example}-{backend}-{scheme}")


def _recomposes_norms(backend: str) -> bool:
    """A backend with an RMSNorm fusion policy has its norms recomposed before annotation."""
    return edgeplug.get_backend(backend).fusion_policy("rms_norm") is not None


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


@pytest.mark.parametrize("example,backend,scheme", list(_cases()))
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
    expected = NORMS[example] if _recomposes_norms(backend) else 0
    assert len(info.fusions) == expected
    assert all(r.outcome in ("fused", "folded_weight") for r in info.fusions), [r.reason for r in info.fusions]
    with torch.no_grad():
        out = gm(*inputs)
    assert torch.isfinite(out).all()
    # quantization error, not a broken program: within a fraction of the output's range
    bound = (0.45 if info.weight_bits == 4 else 0.2) * reference.abs().max().item()
    err = (out - reference).abs().max().item()
    assert err < bound, f"{example} {backend} {scheme}: |quantized - float| = {err:.3f}"
