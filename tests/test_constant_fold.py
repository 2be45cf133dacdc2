"""Constant folding (edgeplug._graph.fold) on real exported programs.

The decoder cases use edgeplug._zoo's one-layer transformers Llama (conftest's
``zoo``: attention mask, positions and rotary tables built from constants at static shapes);
the rules each get a tiny model of their own.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch import nn
from torch.export import Dim
from torch.export.graph_signature import InputKind

import edgeplug
from edgeplug._graph.fold import fold_constant_subgraphs
from edgeplug._graph.ops import op_name
from edgeplug._graph.passes import check_program

#: ops a transformers decoder uses only to build its mask, positions and rotary tables
#: (left on the CPU by a backend without kernels for them); ``where`` and ``any`` also run on the scores
MASK_AND_POSITION_OPS = {
    "aten.arange.start_step",
    "aten.cumsum.default",
    "aten.index.Tensor",
    "aten.scalar_tensor.default",
    "aten.bitwise_and.Tensor",
    "aten.le.Tensor",
    "aten.cos.default",
    "aten.sin.default",
}


def _edge(ep):
    from executorch.exir import EdgeCompileConfig, to_edge

    return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()


def _ops(ep) -> Counter:
    return Counter(op_name(n) for n in ep.graph.nodes if n.op == "call_function")


def _code(ep) -> tuple:
    sig = ep.graph_signature
    return (ep.graph_module.code, [(s.kind, s.target, s.arg.name) for s in sig.input_specs], sorted(ep.constants), sorted(ep.state_dict))


def _placeholders(ep) -> dict[str, torch.fx.Node]:
    return {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}


def _folded_constant(ep, record) -> torch.Tensor:
    """The tensor the fold of ``record`` left in the program (its placeholder reads it)."""
    spec = next(s for s in ep.graph_signature.input_specs if s.target == f"folded_{record.node}")
    assert spec.kind == InputKind.CONSTANT_TENSOR and spec.arg.name in _placeholders(ep)
    return ep.constants[spec.target]


# --------------------------------------------------------------------------- a decoder


@pytest.fixture(scope="session")
def llama(zoo):
    pytest.importorskip("transformers")
    _, ep, inputs, _ = zoo.exported("llama", 1)
    return ep, inputs


@pytest.fixture(scope="module")
def decoder_folded(llama):
    """(edge program before, after folding, the records, example inputs)."""
    ep, inputs = llama
    before = _edge(copy.deepcopy(ep))
    after = copy.deepcopy(before)
    records = fold_constant_subgraphs(after)
    return before, after, records, inputs


def test_decoder_mask_and_positions_are_folded(decoder_folded):
    before, after, records, _ = decoder_folded
    check_program(after)
    assert MASK_AND_POSITION_OPS <= set(_ops(before)), _ops(before)
    assert not MASK_AND_POSITION_OPS & set(_ops(after)), _ops(after)
    # nothing constant-only is left to compute but what reads a parameter
    params = {s.arg.name for s in after.graph_signature.input_specs if s.kind == InputKind.PARAMETER}
    for node in edgeplug._graph.constant_only_nodes(after):
        if node.op == "call_function":
            assert any(a.name in params for a in node.all_input_nodes), node.format_node()


def test_decoder_numbers_are_unchanged(decoder_folded):
    before, after, _, inputs = decoder_folded
    assert torch.equal(before.module()(*inputs), after.module()(*inputs))


def test_records_match_the_graph(decoder_folded):
    before, after, records, _ = decoder_folded
    folds = [r for r in records if r.outcome == "applied"]
    assert folds == records and all(r.transform == "constant_fold" and r.kind == "fold" for r in records)
    assert {r.op for r in folds} >= {"aten.where.self"}  # the mask
    names_after = {n.name for n in after.graph.nodes}
    for r in folds:
        assert r.node not in names_after
        value = _folded_constant(after, r)
        assert r.bytes_added == value.numel() * value.element_size()
        assert str(tuple(value.shape)) in r.detail
    # each fold removed r.removed nodes; each new constant is one placeholder
    added = set(after.constants) - set(before.constants)
    assert len(before.graph.nodes) - len(after.graph.nodes) == sum(r.removed for r in folds) - len(added)
    assert added == {f"folded_{r.node}" for r in folds if r.bytes_added}
    for s in after.graph_signature.input_specs:  # every constant the signature names is there
        if s.kind in (InputKind.CONSTANT_TENSOR, InputKind.BUFFER):
            assert s.target in after.constants or s.target in after.state_dict, s.target


def test_parameters_are_untouched(decoder_folded):
    before, after, _, _ = decoder_folded

    def params(ep):
        return {s.target: s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.PARAMETER}

    assert params(before) == params(after)
    assert all(before.state_dict[t] is after.state_dict[t] or torch.equal(before.state_dict[t], after.state_dict[t]) for t in params(after))
    # the weights' permutes (what a linear delegate prepacks) are still computed from the parameters
    assert _ops(after)["aten.permute_copy.default"] == _ops(before)["aten.permute_copy.default"] > 0


@pytest.fixture(scope="module")
def fused_lowered(llama):
    """The decoder lowered for real on fixture-fused and verified on its host kernel."""
    from edgeplug_fixture_backends import FUSED, registered

    ep, inputs = llama
    with registered():
        return edgeplug.lower(copy.deepcopy(ep), inputs, FUSED, verify=True)


def test_lowering_leaves_no_mask_op_on_the_cpu(fused_lowered):
    report = fused_lowered.report
    assert not MASK_AND_POSITION_OPS & set(report.cpu_ops), report.to_table()
    folds = [t for t in report.transforms if t.transform == "constant_fold" and t.outcome == "applied"]
    assert {t.op for t in folds} >= {"aten.where.self"}
    assert "constant_fold (fold)" in report.to_table()
    assert report.verification.passed and report.verification.max_abs_diff <= 1e-4


# --------------------------------------------------------------------------- the rules, one model each


class Mixed(nn.Module):
    """A constant table, a view of a buffer, a `1 + w` weight and a runtime branch."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.rand(8) + 0.5)
        self.register_buffer("b", torch.randn(2, 4))

    def forward(self, x):
        positions = torch.arange(8).view(1, 8).float() * 0.5  # constant-only: folded
        return x * (1 + self.w) + positions + self.b.view(8) + x.sum()


@pytest.fixture(params=["aten", "edge"])
def mixed(request):
    ep = torch.export.export(Mixed().eval(), (torch.randn(3, 8),))
    return ep if request.param == "aten" else _edge(ep)


def test_only_the_frontier_is_folded(mixed):
    x = torch.randn(3, 8)
    expected = mixed.module()(x)
    records = fold_constant_subgraphs(mixed)
    check_program(mixed)
    # the positions: arange, view, cast and multiply become one (1, 8) float constant
    [positions] = [r for r in records if r.op == "aten.mul.Tensor"]
    assert positions.removed >= 4 and positions.bytes_added == 32
    assert "arange" not in str(_ops(mixed))
    # (edge dialect also casts the literal 1 of `1 + w` from a lifted int constant: that cast folds)
    assert all(r.op in ("aten.mul.Tensor", "dim_order_ops._to_dim_order_copy.default") for r in records)
    # `1 + w` reads a parameter and `b.view(8)` only rearranges a buffer: both stay
    nodes = {n.name: n for n in mixed.graph.nodes}
    [one_plus_w] = [n for n in nodes["p_w"].users if op_name(n) == "aten.add.Tensor"]
    [view_b] = [n for n in nodes["b_b"].users if op_name(n).startswith("aten.view")]
    assert sum(_ops(mixed).values()) == 7  # add (x4), mul, view, sum: nothing else is computed
    assert torch.equal(mixed.module()(x), expected)


def test_budget_zero_folds_nothing(mixed):
    code = _code(mixed)
    assert fold_constant_subgraphs(mixed, budget=0) == []
    assert _code(mixed) == code


class Table(nn.Module):
    """A (16, 8, 8) float table from a (8, 8) bool comparison: over a small budget, the smaller part folds."""

    def forward(self, x):
        i = torch.arange(8)
        causal = (i.view(8, 1) >= i.view(1, 8)).float()  # 256 bytes
        return x + causal.expand(16, 8, 8).contiguous() * 2.0  # 4096 bytes


def test_over_budget_stays_with_its_note_and_what_it_reads_folds():
    ep = _edge(torch.export.export(Table(), (torch.randn(16, 8, 8),)))
    x = torch.randn(16, 8, 8)
    expected = ep.module()(x)
    records = fold_constant_subgraphs(ep, budget=1000)
    check_program(ep)
    kept = [r for r in records if r.outcome == "refused"]
    folds = [r for r in records if r.outcome == "applied"]
    assert kept and all(r.bytes_added == 0 and "over the backend's constant_fold_budget of 1,000 bytes" in r.detail for r in kept)
    assert any("4,096 bytes" in r.detail for r in kept)
    names = {n.name for n in ep.graph.nodes}
    assert all(r.node in names for r in kept)  # still computed at run time
    assert folds and all(r.bytes_added <= 1000 for r in folds)
    assert "aten.arange.start_step" not in _ops(ep) and "aten.ge.Tensor" not in _ops(ep)
    assert torch.equal(ep.module()(x), expected)
    # with the default budget the whole table is one constant
    again = _edge(torch.export.export(Table(), (x,)))
    [whole] = fold_constant_subgraphs(again)
    assert whole.outcome == "applied" and whole.removed and whole.bytes_added == 16 * 8 * 8 * 4


class Twice(nn.Module):
    """Two layers building the same table, as each decoder layer builds its mask and rotary tables."""

    def forward(self, x, y):
        return x * torch.arange(8).float().cos() + y * torch.arange(8).float().cos()


def test_identical_folds_share_one_constant():
    ep = _edge(torch.export.export(Twice(), (torch.randn(8), torch.randn(8))))
    inputs = (torch.randn(8), torch.randn(8))
    expected = ep.module()(*inputs)
    constants = set(ep.constants)
    first, second = fold_constant_subgraphs(ep)
    check_program(ep)
    [added] = set(ep.constants) - constants
    assert first.bytes_added == 32 and second.bytes_added == 0 and first.node in second.detail
    [ph] = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name.endswith(added)]
    assert sorted(op_name(u) for u in ph.users) == ["aten.mul.Tensor"] * 2
    assert "aten.cos.default" not in _ops(ep)
    assert torch.equal(ep.module()(*inputs), expected)


class Bf16(nn.Module):
    def forward(self, x):
        return x + torch.arange(8, dtype=torch.bfloat16).exp() / 3


def test_bf16_stays_bf16():
    ep = _edge(torch.export.export(Bf16(), (torch.randn(8, dtype=torch.bfloat16),)))
    [fold] = fold_constant_subgraphs(ep)
    value = _folded_constant(ep, fold)
    assert value.dtype == torch.bfloat16
    assert torch.equal(value, torch.arange(8, dtype=torch.bfloat16).exp() / 3)


class Dynamic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("keep", torch.tensor([1, 0, 1, 1, 0, 1, 0, 1], dtype=torch.bool))

    def forward(self, x):
        s = x.shape[0]
        mask = torch.ones(s, s).triu(1)  # depends on the dynamic size
        picked = torch.arange(8)[self.keep.nonzero().squeeze(1)]  # data-dependent (unbacked) size
        return x @ (x.T + mask) + picked.float().sum() + torch.arange(4).float().sum()


def _symbolic(node: torch.fx.Node) -> bool:
    """A value with a symbolic size (or a symbolic scalar), or computed from one."""
    val = node.meta.get("val")
    if isinstance(val, torch.SymInt) or (isinstance(val, torch.Tensor) and not all(isinstance(d, int) for d in val.shape)):
        return True
    return any(_symbolic(i) for i in node.all_input_nodes if i.op == "call_function")


def test_dynamic_sizes_are_not_folded():
    s = Dim("s", min=2, max=64)
    ep = torch.export.export(Dynamic(), (torch.randn(5, 5),), dynamic_shapes=({0: s, 1: s},))
    ep = _edge(ep)
    symbolic = {n.name for n in ep.graph.nodes if n.op == "call_function" and _symbolic(n)}
    assert len(symbolic) > 10  # the mask (full, arange, sub, ge, where of size s) and nonzero's chain
    records = fold_constant_subgraphs(ep)
    check_program(ep)
    assert symbolic <= {n.name for n in ep.graph.nodes}
    # what has static sizes folds: arange(4).float().sum(), arange(8) before the data-dependent index
    folds = {r.node: r for r in records if r.outcome == "applied"}
    assert {"aten_sum_dim_int_list_1", "aten_arange_start_step_2"} <= set(folds), records
    assert not [r for r in records if r.outcome == "refused"]
    for n in (5, 9):
        x = torch.randn(n, n)
        assert torch.allclose(ep.module()(x), Dynamic()(x))


# --------------------------------------------------------------------------- failures


@torch.library.custom_op("edgeplug_fold_test::host_missing", mutates_args=())
def host_missing(t: torch.Tensor) -> torch.Tensor:
    """An op this host cannot run (as a device-only kernel): evaluating it at AOT fails."""
    raise RuntimeError("no kernel for this op on the host")


@host_missing.register_fake
def _(t):
    return torch.empty_like(t)


class Unfoldable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("b", torch.randn(8))

    def forward(self, x):
        return x + host_missing(self.b)


def test_a_failed_evaluation_leaves_the_program_unchanged():
    ep = torch.export.export(Unfoldable(), (torch.randn(8),))
    code = _code(ep)
    [record] = fold_constant_subgraphs(ep)
    assert _code(ep) == code
    assert record.outcome == "refused" and record.op == "edgeplug_fold_test.host_missing.default"
    assert "not folded" in record.detail and "no kernel for this op on the host" in record.detail


# --------------------------------------------------------------------------- the pipeline


class Positions(nn.Module):
    def forward(self, x):
        return x + torch.arange(32).float().view(4, 8).cumsum(1) * 0.5


def test_lower_folds_with_the_backend_budget(edgeplug_register, fixture_backends):
    """The edge stage runs the fold first, with the budget of the backend being lowered for."""
    spec = edgeplug.get_backend(fixture_backends.FUSED).spec

    class NoFold:
        @edgeplug.hookimpl
        def edgeplug_backends(self):
            yield spec.model_copy(update={"backend": "fixture-nofold", "constant_fold_budget": 0})

    x = torch.randn(4, 8)
    folded = edgeplug.lower(Positions(), (x,), fixture_backends.FUSED, verify=True)
    [fold] = [t for t in folded.report.transforms if t.transform == "constant_fold"]
    assert fold.outcome == "applied" and fold.removed >= 4 and fold.bytes_added == 4 * 8 * 4
    assert "aten.cumsum.default" not in folded.report.cpu_ops
    assert folded.report.verification.passed

    edgeplug_register(NoFold(), name="fixture-nofold")
    kept = edgeplug.lower(Positions(), (x,), "fixture-nofold", verify=True)
    assert not [t for t in kept.report.transforms if t.transform == "constant_fold"]
    assert kept.report.cpu_ops.get("aten.cumsum.default") == 1
    assert kept.report.verification.passed


class BigTable(nn.Module):
    """A 2 MiB float table (from a 4 MiB int64 arange): over the default 1 MiB budget."""

    def forward(self, x):
        return x + torch.arange(512 * 1024).float()


def test_the_report_names_what_the_budget_left(fixture_backends):
    result = edgeplug.lower(BigTable(), (torch.randn(512 * 1024),), fixture_backends.TABLE, dry_run=True)
    left = [t for t in result.report.transforms if t.transform == "constant_fold"]
    assert left and all(t.outcome == "refused" for t in left)
    table = result.report.to_table()
    assert "0 applied" in table and f"{len(left)} left as they were" in table
    assert "2,097,152 bytes, over the backend's constant_fold_budget of 1,048,576 bytes" in table
