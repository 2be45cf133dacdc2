"""Samsung's a8w8 quantizes a decoder whose RMSNorm casts before its weight (transformers' form).

``weight * x.to(input_dtype)``: ``torch.export`` puts an ``aten._assert_tensor_metadata``
after each ``.to``, a second user of the normalised tensor. The norm used to be
recomposed before annotation without its weight, ``rms_norm(x, shape, None, eps)``,
and EnnQuantizer's rms_norm annotator (which reads argument 2 as the weight) stopped
``prepare`` with "Expected input_edge to have type Tuple[Node, Node], but got:
(None, rms_norm_default)". The asserts compute nothing and are dropped first (``drop_no_op_casts``).
"""

from __future__ import annotations

import pytest
import torch

import edgeplug


class _CastNorm(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(1.0 + 0.2 * torch.randn(dim))

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(dtype)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.proj = _CastNorm(64), torch.nn.Linear(64, 64, bias=False)

    def forward(self, x):
        return x + self.proj(self.norm(x))


@pytest.fixture(scope="module")
def quantized():
    torch.manual_seed(0)
    model, x = _Block().eval(), torch.randn(1, 8, 64)
    return model, x, edgeplug.quantize(model, (x,), "samsung", "a8w8")


def test_the_norm_is_recomposed_with_its_weight_and_prepares(quantized):
    _, _, q = quantized
    (norm,) = q.quantization.fusions
    assert norm.outcome == "fused" and norm.weight is not None, norm
    norms = [n for n in q.program.graph.nodes if n.target is torch.ops.aten.rms_norm.default]
    assert len(norms) == 1 and norms[0].args[2] is not None, [n.args for n in norms]
    assert not [n for n in q.program.graph.nodes if n.target is torch.ops.aten.mul.Tensor], "the weight multiply stayed"


def test_the_quantized_block_stays_close_to_the_float_one(quantized):
    model, x, q = quantized
    with torch.no_grad():
        want, got = model(x), q(x)
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0).item()
    assert cosine > 0.99, cosine


def test_the_callers_program_keeps_its_asserts():
    torch.manual_seed(0)
    model, x = _Block().eval(), torch.randn(1, 8, 64)
    ep = torch.export.export(model, (x,))
    before = [n.name for n in ep.graph.nodes]
    edgeplug.quantize(ep, (x,), "samsung", "a8w8")
    assert [n.name for n in ep.graph.nodes] == before
    assert any(n.target is torch.ops.aten._assert_tensor_metadata.default for n in ep.graph.nodes)
