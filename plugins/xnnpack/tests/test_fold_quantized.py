"""The core's constant folding on a program XNNPACK's quantizer annotated: the qdq stay as they are.

Moved from tests/test_constant_fold.py (the core's tests lower to fixture backends; this one needs a
first-party quantizer).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

import edgeplug
from edgeplug._graph.fold import fold_constant_subgraphs
from edgeplug._graph.ops import is_qdq, op_name
from edgeplug._graph.passes import check_program


def _edge(ep):
    from executorch.exir import EdgeCompileConfig, to_edge

    return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()


def _ops(ep) -> Counter:
    return Counter(op_name(n) for n in ep.graph.nodes if n.op == "call_function")


class Quantizable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x):
        return self.linear(x) + torch.arange(16).float() * 0.1


def test_quantized_program_keeps_its_qdq():
    x = torch.randn(4, 16)
    gm = edgeplug.quantize(Quantizable().eval(), (x,), "xnnpack", "8a8w")
    ep = _edge(torch.export.export(gm, (x,)))
    qdq_before = Counter(op_name(n) for n in ep.graph.nodes if is_qdq(n))
    weight_chain_before = _ops(ep)["aten.permute_copy.default"]
    expected = ep.module()(x)
    records = fold_constant_subgraphs(ep)
    check_program(ep)
    assert Counter(op_name(n) for n in ep.graph.nodes if is_qdq(n)) == qdq_before
    assert _ops(ep)["aten.permute_copy.default"] == weight_chain_before > 0  # permute of the dequantized weight
    for r in records:  # only the float positions fold, nothing behind a dequantize
        assert r.op not in ("aten.permute_copy.default",) and not r.op.startswith("quantized_decomposed")
    assert torch.equal(ep.module()(x), expected)
