"""``collapse_view_chains`` on chains of reshapes: a squeeze then an unsqueeze back to the input's shape (how
transformers' Mamba hands ``conv1d.weight`` to its convolution) is dropped, so the convolution reads the
parameter itself; a chain that changes the shape is kept; the numbers do not move."""

from __future__ import annotations

import torch
from torch import nn

from edgeplug.plugin import apply_rewrite, op_name


class SqueezedWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(8, 8, 4, groups=8, padding=3)

    def forward(self, x):
        w = self.conv.weight.squeeze(1).unsqueeze(1)  # (8, 1, 4) -> (8, 4) -> (8, 1, 4)
        return nn.functional.conv1d(x, w, self.conv.bias, padding=3, groups=8)


class Reshaped(nn.Module):
    def forward(self, x):
        return x.squeeze(0).unsqueeze(1) * 2  # (1, 8, 4) -> (8, 4) -> (8, 1, 4): another shape


def _edge(model, x):
    from executorch.exir import to_edge

    return to_edge(torch.export.export(model.eval(), (x,))).exported_program()


def _weight_of_convolution(ep):
    (conv,) = [n for n in ep.graph.nodes if n.op == "call_function" and op_name(n.target) == "aten.convolution.default"]
    return conv.args[1]


def test_a_reshape_chain_back_to_a_parameters_shape_is_dropped():
    x = torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(0))
    model = SqueezedWeight()
    ep = _edge(model, x)
    assert _weight_of_convolution(ep).op == "call_function"  # before: the weight is a view of the parameter
    records = apply_rewrite(ep, "collapse_view_chains")
    weight = _weight_of_convolution(ep)
    assert weight.op == "placeholder", weight
    assert any("at its own shape" in r.detail for r in records), records
    assert not [n for n in ep.graph.nodes if n.op == "call_function" and "squeeze" in op_name(n.target)]
    with torch.no_grad():
        assert torch.equal(ep.module()(x), model(x))


def test_a_reshape_chain_that_changes_the_shape_is_kept():
    x = torch.randn(1, 8, 4, generator=torch.Generator().manual_seed(1))
    ep = _edge(Reshaped(), x)
    apply_rewrite(ep, "collapse_view_chains")
    kept = [op_name(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert "aten.unsqueeze_copy.default" in kept and "aten.squeeze_copy.dims" in kept or "aten.squeeze_copy.dim" in kept, kept
    with torch.no_grad():
        assert torch.equal(ep.module()(x), Reshaped()(x))
