"""Samsung's a8w8 quantizes the RMSNorm forms decoders write, which EnnQuantizer used to refuse.

EnnQuantizer's rms_norm annotator (and ENN's RMSNORM builder) reads argument 2 of a recomposed
``rms_norm`` as a weight node; a norm recomposed without one stopped ``prepare`` with "Expected
input_edge to have type Tuple[Node, Node], but got: (None, rms_norm_default)". Two forms led there:

- ``weight * x.to(input_dtype)`` (transformers' form): ``torch.export`` puts an
  ``aten._assert_tensor_metadata`` after each ``.to``, a second user of the normalised tensor, and the
  norm was recomposed without its weight. The asserts compute nothing and are dropped first
  (``drop_no_op_casts``).
- a norm that has no weight (Mamba's norms of B, C and dt), or whose output is also used beside its
  weight multiply: Samsung's policy (``weightless="ones"``) fuses it with a constant of ones of the
  norm's width, which the annotator quantizes like any weight, and a weighted norm in the same
  block is still fused with its own weight.
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


class _CastBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.proj = _CastNorm(64), torch.nn.Linear(64, 64, bias=False)

    def forward(self, x):
        return x + self.proj(self.norm(x))


def _rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class _WeightlessBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(1.0 + 0.2 * torch.randn(64))
        self.a, self.b = torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 64, bias=False)

    def forward(self, x):
        h = self.a(_rms(x))  # no weight
        return x + self.b(self.weight * _rms(h))


class _AlsoUsedBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(1.0 + 0.2 * torch.randn(64))
        self.a = torch.nn.Linear(64, 64, bias=False)

    def forward(self, x):
        h = _rms(x)
        return x + self.a(self.weight * h + h)  # the norm's output is also used: its multiply stays


BLOCKS = {"cast": _CastBlock, "weightless": _WeightlessBlock, "also_used": _AlsoUsedBlock}


@pytest.fixture(scope="module")
def quantized():
    """``quantized(form)``: (float block, input, the block quantized for samsung a8w8), made once per form."""
    made: dict = {}

    def get(form: str):
        if form not in made:
            torch.manual_seed(0)
            model, x = BLOCKS[form]().eval(), torch.randn(1, 8, 64)
            made[form] = model, x, edgeplug.quantize(model, (x,), "samsung", "a8w8")
        return made[form]

    return get


@pytest.mark.parametrize("form", sorted(BLOCKS))
def test_the_quantized_block_stays_close_to_the_float_one(quantized, form):
    model, x, q = quantized(form)
    with torch.no_grad():
        want, got = model(x), q(x)
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0).item()
    assert cosine > 0.99, cosine


def test_a_cast_norm_is_recomposed_with_its_weight_and_prepares(quantized):
    _, _, q = quantized("cast")
    (norm,) = q.quantization.fusions
    assert norm.outcome == "fused" and norm.weight is not None, norm
    norms = [n for n in q.program.graph.nodes if n.target is torch.ops.aten.rms_norm.default]
    assert len(norms) == 1 and norms[0].args[2] is not None, [n.args for n in norms]
    assert not [n for n in q.program.graph.nodes if n.target is torch.ops.aten.mul.Tensor], "the weight multiply stayed"


def _norms(q):
    return [n for n in q.program.graph.nodes if n.target is torch.ops.aten.rms_norm.default]


def test_the_weightless_norm_is_fused_with_a_ones_weight_and_prepares(quantized):
    _, _, q = quantized("weightless")
    outcomes = sorted((f.outcome, "rms_norm_unit_weight_64" in (f.weight or "")) for f in q.quantization.fusions)
    assert outcomes == [("fused", False), ("fused", True)], q.quantization.fusions
    norms = _norms(q)
    assert len(norms) == 2 and all(isinstance(n.args[2], torch.fx.Node) for n in norms), [n.args for n in norms]
    assert not any(n.target is torch.ops.aten.rsqrt.default for n in q.program.graph.nodes)


def test_the_output_also_used_norm_is_fused_with_a_ones_weight_and_its_multiply_stays(quantized):
    _, _, q = quantized("also_used")
    (fusion,) = q.quantization.fusions
    assert fusion.outcome == "fused" and "rms_norm_unit_weight_64" in fusion.weight, fusion
    (norm,) = _norms(q)
    assert isinstance(norm.args[2], torch.fx.Node), norm.args
    assert any(n.target is torch.ops.aten.mul.Tensor for n in q.program.graph.nodes), "the weight multiply went"


def test_the_callers_program_keeps_its_asserts():
    torch.manual_seed(0)
    model, x = _CastBlock().eval(), torch.randn(1, 8, 64)
    ep = torch.export.export(model, (x,))
    before = [n.name for n in ep.graph.nodes]
    edgeplug.quantize(ep, (x,), "samsung", "a8w8")
    assert [n.name for n in ep.graph.nodes] == before
    assert any(n.target is torch.ops.aten._assert_tensor_metadata.default for n in ep.graph.nodes)


def test_other_policies_still_fuse_a_weightless_norm():
    torch.manual_seed(0)
    model, x = _WeightlessBlock().eval(), torch.randn(1, 8, 64)
    q = edgeplug.quantize(model, (x,), "qnn", "8a8w")
    assert all(f.outcome != "rejected" for f in q.quantization.fusions), q.quantization.fusions
