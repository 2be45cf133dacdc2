"""The built-in examples: built in code, deterministic, the contract FILE.py:ATTR follows."""

from __future__ import annotations

import sys

import pytest
import torch

from edgeplug._errors import EdgeplugError
from edgeplug.examples import EXAMPLES, list_examples, load_model


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_follows_the_contract_and_is_deterministic(name):
    model, inputs, _, label = load_model(name)
    assert label == name
    assert isinstance(model, torch.nn.Module) and not model.training
    assert isinstance(inputs, tuple) and all(isinstance(t, torch.Tensor) for t in inputs)
    again, inputs_again, _, _ = load_model(name)
    assert all(torch.equal(a, b) for a, b in zip(inputs, inputs_again))
    state, state_again = model.state_dict(), again.state_dict()
    assert state.keys() == state_again.keys()
    assert all(torch.equal(state[k], state_again[k]) for k in state)
    with torch.no_grad():
        out = model(*inputs)
    assert torch.isfinite(out).all()
    assert list_examples()[name]


def _targets(ep) -> set:
    return {n.target for n in ep.graph.nodes if n.op == "call_function"}


def test_llama_has_rmsnorm_attention_and_swiglu(llama_exported, llama_example):
    aten = torch.ops.aten
    targets = _targets(llama_exported)
    # hand-written RMSNorm: x * rsqrt(mean(x^2) + eps) * w
    assert {aten.pow.Tensor_Scalar, aten.mean.dim, aten.rsqrt.default} <= targets
    # causal attention
    assert aten.softmax.int in targets or aten._softmax.default in targets
    # SwiGLU: silu(w1 x) * w3 x
    assert aten.silu.default in targets
    model, (tokens,) = llama_example
    assert tokens.dtype == torch.int64 and tokens.shape == (1, 16)
    norm_weights = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    assert len(norm_weights) == 5  # two per block, two blocks, and the final norm
    assert all(not torch.equal(w, torch.ones_like(w)) for w in norm_weights)  # a fused weight shows


def test_llama_is_causal(llama_example):
    model, (tokens,) = llama_example
    changed = tokens.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 128
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :-1], b[:, :-1])  # earlier positions do not see the last token
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_gemma_block_scales_by_one_plus_weight():
    model, inputs, _, _ = load_model("gemma-block")
    targets = _targets(torch.export.export(model, inputs))
    assert torch.ops.aten.gelu.default in targets
    # Gemma's norm weight lives around 0 and is used as (1 + w)
    w = model.norm.weight.detach()
    assert w.abs().mean() < 0.5
    assert torch.ops.aten.add.Tensor in targets


def test_model_file_contract(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Linear(4, 2), torch.ones(3, 4)\n"  # a bare tensor is accepted as one input
        "def as_list():\n"
        "    return torch.nn.Linear(4, 2), [torch.ones(3, 4)]\n"
    )
    model, inputs, _, label = load_model(f"{path}:build")
    assert isinstance(model, torch.nn.Linear) and label == f"{path}:build"
    assert len(inputs) == 1 and inputs[0].shape == (3, 4)
    _, inputs, _, _ = load_model(f"{path}:as_list")
    assert isinstance(inputs, tuple) and len(inputs) == 1


def test_model_file_that_fails_to_import_says_so(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import torch\nraise RuntimeError('checkpoint not found')\n")
    with pytest.raises(EdgeplugError, match=r"importing .*broken.py failed: RuntimeError: checkpoint not found"):
        load_model(f"{path}:build")
    assert "_edgeplug_user_broken" not in sys.modules
