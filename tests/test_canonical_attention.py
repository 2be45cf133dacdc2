"""The attention rewrites at symbolic sizes (edgeplug._graph.canonical.attention), on real exported programs.

A rotary rotate_half and a masked scaled-dot-product attention (export decomposes it with
``_safe_softmax``), exported with a dynamic sequence length and run through ``to_edge``: each
rewrite is exact against the program before it at several sequence lengths, records what it did, and leaves alone what it must not touch.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch import nn

from edgeplug._graph.ops import op_name
from edgeplug.plugin import apply_rewrite

LENGTHS = (1, 5, 16)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """Rotary q and k (rotate_half on a symbolic-length tensor) and masked attention over a static cache
    length: a causal mask from the positions, with rows masked entirely where ``pos`` is negative."""

    def __init__(self, cache: int = 16, head: int = 8) -> None:
        super().__init__()
        self.register_buffer("keys", torch.randn(1, 2, cache, head))
        self.register_buffer("values", torch.randn(1, 2, cache, head))

    def forward(self, q: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        q = q * 0.5 + rotate_half(q) * 0.25
        k = self.keys + rotate_half(self.keys)  # static: symbolic_only leaves it
        mask = torch.arange(self.keys.shape[2])[None, :] <= pos[:, None]  # [s, cache]
        return nn.functional.scaled_dot_product_attention(q, k, self.values, attn_mask=mask)


def _edge(model: nn.Module, inputs: tuple, dynamic: bool = True):
    from executorch.exir import EdgeCompileConfig, to_edge

    seq = torch.export.Dim("seq", min=1, max=16)
    shapes = ({2: seq}, {0: seq}) if dynamic else None
    with torch.no_grad():
        ep = torch.export.export(model, inputs, dynamic_shapes=shapes)
    return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()


def _inputs(s: int, *, all_masked: int = 0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, s, 8, generator=g) * 4
    pos = torch.randint(0, 16, (s,), generator=g)
    pos[:all_masked] = -1  # these rows see no key: the safe softmax gives them 0
    return q, pos


@pytest.fixture(scope="module")
def attention_edge():
    torch.manual_seed(0)
    model = Attention().eval()
    return model, _edge(model, _inputs(5))


def _ops(ep) -> Counter:
    return Counter(op_name(n) for n in ep.graph_module.graph.nodes if n.op == "call_function")


def _applied(ep, name: str, **params):
    after = copy.deepcopy(ep)
    return after, apply_rewrite(after, name, **params)


def _run(ep, inputs) -> torch.Tensor:
    with torch.no_grad():
        return ep.module()(*inputs)


def _node_count(ep) -> int:
    return sum(1 for n in ep.graph_module.graph.nodes if n.op in ("call_function", "placeholder"))


@pytest.mark.parametrize("name, gone", [
    ("rotate_half_as_matmul", {"aten.neg.default": 1, "aten.slice_copy.Tensor": 2}),
    ("safe_softmax_as_floats", {"aten.eq.Scalar": 1, "aten.logical_not.default": 2, "aten.any.dim": 1, "aten.full_like.default": 1}),
])
def test_rewrite_is_exact_at_every_length_and_recorded(attention_edge, name, gone):
    model, ep = attention_edge
    after, records = _applied(ep, name)
    assert len(records) == 1 and records[0].transform == name and records[0].kind == "rewrite"
    before_ops, after_ops = _ops(ep), _ops(after)
    for op, count in gone.items():
        assert before_ops[op] - after_ops[op] == count, (op, before_ops[op], after_ops[op])
    assert _node_count(after) - _node_count(ep) == records[0].added - records[0].removed
    for s in LENGTHS:
        for masked in (0, 1):
            inputs = _inputs(s, all_masked=masked if s > 1 else 0, seed=s)
            want, got = _run(ep, inputs), _run(after, inputs)
            assert torch.equal(got, want), (name, s, masked, (got - want).abs().max())
            torch.testing.assert_close(got, model(*inputs), rtol=1e-5, atol=1e-5)  # eager runs a fused kernel


def test_rows_of_minus_inf_give_zero_and_a_row_at_the_stated_bound_is_left_exact():
    """The safe softmax rewritten, on scores built directly: all -inf rows, mixed rows, and a row whose
    max sits just above the stated bound (half the lowest float32)."""

    class Soft(nn.Module):
        def forward(self, x):
            return torch.ops.aten._safe_softmax(x, -1)

    lo = torch.finfo(torch.float32).min
    seq = torch.export.Dim("seq", min=1, max=8)
    from executorch.exir import EdgeCompileConfig, to_edge

    ep = to_edge(torch.export.export(Soft(), (torch.randn(1, 3, 6),), dynamic_shapes=({1: seq},)),
                 compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    after, records = _applied(ep, "safe_softmax_as_floats")
    assert len(records) == 1
    x = torch.randn(1, 4, 6) * 30
    x[0, 0] = float("-inf")
    x[0, 1, :3] = float("-inf")
    x[0, 2] = lo / 2 * 0.99
    x[0, 2, 4] = float("-inf")
    x[0, 3, 1] = float("inf")  # a row with inf: NaN either way
    want, got = _run(ep, (x,)), _run(after, (x,))
    assert torch.equal(want[0, :3], got[0, :3]) and bool(want[0, 0].eq(0).all())
    assert bool(got[0, 3].isnan().any()) and bool(want[0, 3].isnan().any())


def test_a_half_read_elsewhere_stays_and_the_records_count_what_went():
    class Shared(nn.Module):
        def forward(self, x):
            high = x[..., 4:]
            return rotate_half(x) + torch.cat((high, high), -1)  # x[..., 4:] read twice: export keeps one slice

    seq = torch.export.Dim("seq", min=1, max=8)
    from executorch.exir import EdgeCompileConfig, to_edge

    x = torch.randn(1, 2, 4, 8)
    ep = to_edge(torch.export.export(Shared(), (x,), dynamic_shapes=({2: seq},)),
                 compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    after, records = _applied(ep, "rotate_half_as_matmul")
    assert len(records) == 1
    assert _node_count(after) - _node_count(ep) == records[0].added - records[0].removed
    for s in (1, 3, 8):
        inputs = (torch.randn(1, 2, s, 8),)
        assert torch.equal(_run(after, inputs), _run(ep, inputs))


def test_what_they_must_leave_alone():
    class Other(nn.Module):
        """A rotate by a quarter (not rotate_half), a cat of neg and slice along a middle dim, a plain
        softmax, and a where on a bool that is not softmax's guard."""

        def forward(self, x):
            quarter = torch.cat((-x[..., 2:], x[..., :2]), dim=-1)  # last dim 8: not halves
            middle = torch.cat((-x[:, :, 2:], x[:, :, :2]), dim=2)  # halves of dim 2, not the last
            soft = torch.softmax(x, -1)
            guard = torch.where(x > 0, torch.zeros_like(soft), soft)
            return quarter + middle + guard

    seq = torch.export.Dim("seq", min=1, max=8)
    from executorch.exir import EdgeCompileConfig, to_edge

    x = torch.randn(1, 2, 4, 8)
    ep = to_edge(torch.export.export(Other(), (x,), dynamic_shapes=({1: seq},)),
                 compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    for name in ("rotate_half_as_matmul", "safe_softmax_as_floats"):
        after, records = _applied(ep, name)
        assert records == [] and _ops(after) == _ops(ep), name
    # rotate_half on a static tensor: left unless asked (symbolic_only=False), then exact too
    static = _edge(Attention().eval(), _inputs(5), dynamic=False)
    after, records = _applied(static, "rotate_half_as_matmul")
    assert records == []
    after, records = _applied(static, "rotate_half_as_matmul", symbolic_only=False)
    assert len(records) == 2 and torch.equal(_run(after, _inputs(5)), _run(static, _inputs(5)))
    # bf16 is not among the default dtypes
    after, records = _applied(_edge(Attention().eval().to(torch.bfloat16), tuple(t.to(torch.bfloat16) if t.is_floating_point() else t for t in _inputs(5))), "rotate_half_as_matmul")
    assert records == []


def test_repeated_pure_ops_are_computed_once_and_others_are_left():
    """merge_duplicates: each 'layer' turns one bool mask into -inf/0 again and builds arange(0, seq) again;
    the repeats read the first. A where on another mask and a 0.0 beside a -0.0 stay apart."""

    class Layers(nn.Module):
        def forward(self, x, pos):
            mask = torch.arange(x.shape[-1])[None, :] <= pos[:, None]
            out = x
            for _ in range(3):
                bias = torch.where(mask, 0.0, float("-inf"))
                out = out + bias + torch.arange(x.shape[1]).to(x.dtype)[:, None]
            other = torch.where(~mask, 0.0, float("-inf"))
            return out + other + torch.where(mask, -0.0, float("-inf"))

    seq = torch.export.Dim("seq", min=1, max=8)
    from executorch.exir import EdgeCompileConfig, to_edge

    x, pos = torch.randn(1, 4, 6), torch.tensor([0, 2, 5, 3])
    ep = to_edge(torch.export.export(Layers(), (x, pos), dynamic_shapes=({1: seq}, {0: seq})),
                 compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    after, records = _applied(ep, "merge_duplicates")
    assert records and all(r.transform == "merge_duplicates" and (r.added, r.removed) == (0, 1) for r in records)
    assert _node_count(ep) - _node_count(after) == len(records)
    wheres = _ops(after)["aten.where.self"]
    assert _ops(ep)["aten.where.self"] >= 5 and wheres == 3, wheres  # the mask's, ~mask's, and the -0.0 one
    for s in (1, 4, 8):
        inputs = (torch.randn(1, s, 6), torch.randint(0, 6, (s,)))
        assert torch.equal(_run(after, inputs), _run(ep, inputs))
    assert _applied(ep, "merge_duplicates", ops=("aten.sub.Tensor",))[1] == []
