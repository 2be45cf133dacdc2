"""The attention rewrites at symbolic sizes (edgeplug._graph.canonical.attention), on real exported programs.

A rotary rotate_half and a masked scaled-dot-product attention (export decomposes it with
``_safe_softmax``), exported with a dynamic sequence length and run through ``to_edge``: each
rewrite is exact against the program before it at several sequence lengths, records what it did, and leaves alone what it must not touch.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgeplug.testing.rewrites import RotaryAttention, attention_inputs, attention_program, op_counts, rewritten, rotate_half

LENGTHS = (1, 5, 16)


@pytest.fixture(scope="module")
def attention_edge():
    torch.manual_seed(0)
    model = RotaryAttention().eval()
    return model, attention_program(model, attention_inputs(5))


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
    after, records = rewritten(ep, name)
    assert len(records) == 1 and records[0].transform == name and records[0].kind == "rewrite"
    before_ops, after_ops = op_counts(ep), op_counts(after)
    for op, count in gone.items():
        assert before_ops[op] - after_ops[op] == count, (op, before_ops[op], after_ops[op])
    assert _node_count(after) - _node_count(ep) == records[0].added - records[0].removed
    for s in LENGTHS:
        for masked in (0, 1):
            inputs = attention_inputs(s, all_masked=masked if s > 1 else 0, seed=s)
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
    after, records = rewritten(ep, "safe_softmax_as_floats")
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
    after, records = rewritten(ep, "rotate_half_as_matmul")
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
        after, records = rewritten(ep, name)
        assert records == [] and op_counts(after) == op_counts(ep), name
    # rotate_half on a static tensor: left unless asked (symbolic_only=False), then exact too
    static = attention_program(RotaryAttention().eval(), attention_inputs(5), dynamic=False)
    after, records = rewritten(static, "rotate_half_as_matmul")
    assert records == []
    after, records = rewritten(static, "rotate_half_as_matmul", symbolic_only=False)
    assert len(records) == 2 and torch.equal(_run(after, attention_inputs(5)), _run(static, attention_inputs(5)))
    # bf16 is not among the default dtypes
    after, records = rewritten(attention_program(RotaryAttention().eval().to(torch.bfloat16), tuple(t.to(torch.bfloat16) if t.is_floating_point() else t for t in attention_inputs(5))), "rotate_half_as_matmul")
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
    after, records = rewritten(ep, "merge_duplicates")
    assert records and all(r.transform == "merge_duplicates" and (r.added, r.removed) == (0, 1) for r in records)
    assert _node_count(ep) - _node_count(after) == len(records)
    wheres = op_counts(after)["aten.where.self"]
    assert op_counts(ep)["aten.where.self"] >= 5 and wheres == 3, wheres  # the mask's, ~mask's, and the -0.0 one
    for s in (1, 4, 8):
        inputs = (torch.randn(1, s, 6), torch.randint(0, 6, (s,)))
        assert torch.equal(_run(after, inputs), _run(ep, inputs))
    assert rewritten(ep, "merge_duplicates", ops=("aten.sub.Tensor",))[1] == []
