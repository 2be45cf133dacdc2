"""Samsung's a8w8 quantizes a block whose RMSNorm has no weight (Mamba's norms of B, C and dt).

Recomposed, such a norm is ``rms_norm(x, shape, None, eps)``; EnnQuantizer's rms_norm annotator
reads argument 2 as a weight node and stopped ``prepare`` with "Expected input_edge to have type
Tuple[Node, Node], but got: (None, rms_norm_default)", and ENN's RMSNORM builder reads it as a
tensor too. Samsung's policy keeps a weightless norm decomposed (``weightless="keep"``): the
fusion is recorded as rejected with the reason, no ones weight is invented, and a weighted norm
in the same block is still fused.
"""

from __future__ import annotations

import pytest
import torch

import edgeplug


def _rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(1.0 + 0.2 * torch.randn(64))
        self.a, self.b = torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 64, bias=False)

    def forward(self, x):
        h = self.a(_rms(x))  # no weight
        return x + self.b(self.weight * _rms(h))


@pytest.fixture(scope="module")
def quantized():
    torch.manual_seed(0)
    model, x = _Block().eval(), torch.randn(1, 8, 64)
    return model, x, edgeplug.quantize(model, (x,), "samsung", "a8w8")


def test_the_weightless_norm_stays_decomposed_and_the_weighted_one_is_fused(quantized):
    _, _, q = quantized
    outcomes = sorted((f.outcome, f.weight is None) for f in q.quantization.fusions)
    assert outcomes == [("fused", False), ("rejected", True)], q.quantization.fusions
    (rejected,) = [f for f in q.quantization.fusions if f.outcome == "rejected"]
    assert "no weight" in rejected.reason and "samsung" in rejected.reason, rejected.reason
    norms = [n for n in q.program.graph.nodes if n.target is torch.ops.aten.rms_norm.default]
    assert len(norms) == 1 and isinstance(norms[0].args[2], torch.fx.Node), [n.args for n in norms]
    assert any(n.target is torch.ops.aten.rsqrt.default for n in q.program.graph.nodes)


def test_the_quantized_block_stays_close_to_the_float_one(quantized):
    model, x, q = quantized
    with torch.no_grad():
        want, got = model(x), q(x)
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0).item()
    assert cosine > 0.99, cosine


def test_other_policies_still_fuse_a_weightless_norm():
    torch.manual_seed(0)
    model, x = _Block().eval(), torch.randn(1, 8, 64)
    q = edgeplug.quantize(model, (x,), "qnn", "8a8w")
    assert all(f.outcome != "rejected" for f in q.quantization.fusions), q.quantization.fusions
