"""The core partitioner: "kept whole" implies "delegated or decomposed", and every
node left on the CPU carries the reason the backend gave.

On the fixture backends (tests/fixtures/backends); ``_KeepMore`` makes
fixture-keep keep matmul (not in its table) and linear (in its table, but not
in float64) whole too, as a backend's keep-whole list may hold more than it
takes at every node.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import edgeplug
from edgeplug import PartitionerFilter
from edgeplug._errors import EdgeplugError
from edgeplug._partition import CorePartitioner, SupportTablePartitioner

KEEP, FUSED, STOCK = "fixture-keep", "fixture-fused", "fixture-stock"
#: the fixture backends that take an MLP's ops (fixture-stock takes adds and matmuls only)
FIXTURES = ["fixture-keep", "fixture-fused", "fixture-table", "fixture-offline"]


class _KeepMore:
    @edgeplug.hookimpl
    def edgeplug_keep_whole(self):
        yield edgeplug.KeepWhole(backend=KEEP, ops=(torch.ops.aten.matmul.default, torch.ops.aten.linear.default))


@pytest.fixture
def keep_more(fixture_backends, edgeplug_register):
    edgeplug_register(_KeepMore(), name="keep-more")


class MatmulAndDouble(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x, d):
        return torch.matmul(x, self.w).relu(), torch.nn.functional.linear(d, d)


def _inputs():
    return (torch.randn(2, 3, 8), torch.randn(4, 4, dtype=torch.float64))


def test_keep_whole_uses_the_partition_predicate(keep_more):
    """matmul is kept whole but not in the support table: it must be decomposed."""
    ep = torch.export.export(MatmulAndDouble(), _inputs())
    part = CorePartitioner(edgeplug.get_backend(KEEP), dry_run=True)
    ops, keep = part.ops_to_not_decompose(ep)
    assert torch.ops.aten.matmul.default in ops
    nodes = {n.name: n for n in ep.graph.nodes}
    assert keep(nodes["matmul"]) is False
    assert "not in the fixture-keep support table" in part.keep_decisions["matmul"].reason
    assert keep(nodes["linear"]) is False  # linear is supported, but not in float64
    assert "float64" in part.keep_decisions["linear"].reason


def test_decomposed_matmul_is_delegated_not_left_whole(keep_more):
    rep = edgeplug.lower(MatmulAndDouble(), _inputs(), KEEP, dry_run=True).report
    delegated = {op for p in rep.partitions for op in p.ops}
    top = {c.op for c in rep.cpu_nodes}
    assert "aten.matmul.default" not in delegated | top
    assert {"aten.bmm.default", "aten.relu.default"} <= delegated or {"aten.mm.default", "aten.relu.default"} <= delegated
    assert "aten.linear.default" not in delegated | top  # float64: decomposed, not stranded
    assert rep.kept_whole_on_cpu == []
    assert all("float64" in c.reason for c in rep.cpu_nodes), rep.cpu_nodes


def test_the_support_table_keeps_no_op_whole_that_the_backend_does_not_keep_whole(fixture_backends):
    """The table's own ops_to_not_decompose once kept matmul whole with no filter (stranding it); now it keeps only the backend's keep-whole ops."""
    keep = edgeplug.get_backend(KEEP)
    table = keep.make_partitioner()
    assert isinstance(table, SupportTablePartitioner)
    ops, check = table.ops_to_not_decompose(None)
    assert torch.ops.aten.matmul.default not in ops
    assert ops and set(ops) <= set(keep.keep_whole), set(ops) - set(keep.keep_whole)


class _RaisingFilter:
    @edgeplug.hookimpl
    def edgeplug_partitioner_filters(self):
        def fn(node, ctx):
            raise ValueError("boom")

        yield PartitionerFilter(backend=KEEP, name="raises", fn=fn)


def test_a_filter_that_raises_is_named(keep_more, edgeplug_register):
    edgeplug_register(_RaisingFilter(), name="raising-filter")
    ep = torch.export.export(MatmulAndDouble(), _inputs())
    part = CorePartitioner(edgeplug.get_backend(KEEP), dry_run=True)
    _, keep = part.ops_to_not_decompose(ep)
    node = next(n for n in ep.graph.nodes if n.name == "matmul")
    relu = next(n for n in ep.graph.nodes if n.name == "relu")  # supported: the filter is asked
    with pytest.raises(EdgeplugError, match=r"filter 'raises' \(\S+test_partition\.py:\d+\) of backend 'fixture-keep' from plugin 'raising-filter'.*node 'relu'.*raised ValueError: boom at \S+test_partition\.py:\d+"):
        part.delegable(relu, part.context(ep, "before_decomposition"))
    # the support table said no first: the filter is not even asked for a refused node
    assert keep(node) is False


@pytest.mark.parametrize("backend", FIXTURES)
def test_examples_report_partitions_and_reasons(backend, fixture_backends):
    """`edgeplug lower mlp --dry-run` on each kind of backend: partitions, and a reason per CPU node."""
    from edgeplug.examples import load_model

    model, inputs, _, _ = load_model("mlp")
    rep = edgeplug.lower(model, inputs, backend, dry_run=True).report
    assert rep.partitions and rep.delegated_nodes > 0
    assert rep.kept_whole_on_cpu == []
    for c in rep.cpu_nodes:
        assert c.reason and "no reason recorded" not in c.reason, c


@pytest.mark.slow
@pytest.mark.parametrize("backend", [KEEP, STOCK])
def test_llama_example_reports_every_graph_break(backend, fixture_backends):
    from edgeplug.examples import load_model

    model, inputs, _, _ = load_model("llama")
    rep = edgeplug.lower(model, inputs, backend, dry_run=True).report
    assert rep.partitions
    assert rep.kept_whole_on_cpu == []
    assert sum(rep.cpu_ops.values()) == len(rep.cpu_nodes)
    for c in rep.cpu_nodes:
        assert c.reason and "no reason recorded" not in c.reason, c


def test_support_check_is_the_backends_own_with_its_reasons(fixture_backends):
    """edgeplug._partition.support_check: node -> Verdict, from the plugin (BackendSpec.support_check)."""
    from executorch.exir import EdgeCompileConfig, to_edge

    from edgeplug._partition import Verdict, support_check

    class AtanSwish(nn.Module):
        def forward(self, x, y):
            return torch.atan2(torch.nn.functional.hardswish(x), y)

    aten = torch.export.export(AtanSwish(), (torch.randn(4, 8), torch.randn(4, 8)))
    ep = to_edge(aten, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    atan2 = next(n for n in calls if "atan2" in str(n.target))
    refused = Verdict(False, "fixture-fused: aten.atan2.default is not in the fixture-fused support table")
    own = support_check(edgeplug.get_backend(FUSED), ep.graph_module)  # BackendSpec.support_check
    assert own(atan2) == refused
    table = support_check(edgeplug.get_backend(KEEP))  # no support_check: the support table's verdict
    assert not table(atan2) and "not in the fixture-keep support table" in table(atan2).reason
    assert all(isinstance(table(n), Verdict) for n in calls)
    # aten nodes (before decomposition) are presented to the check as edge ops
    aten_atan2 = next(n for n in aten.graph.nodes if "atan2" in str(n.target))
    assert support_check(edgeplug.get_backend(FUSED))(aten_atan2) == refused
    assert support_check(edgeplug.get_backend(STOCK)) is None  # executorch's demo partitioner states support only by tagging


def test_partition_outcome_is_frozen(keep_more):
    import dataclasses

    part = CorePartitioner(edgeplug.get_backend(KEEP), dry_run=True)
    assert part.outcome is None and part.partitions == [] and part.stranded == []
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    ep = torch.export.export(MatmulAndDouble(), _inputs())
    to_edge_transform_and_lower(ep, partitioner=[part], compile_config=EdgeCompileConfig(_check_ir_validity=False))
    out = part.outcome
    assert out.partitions and out.cpu_reasons and out.tags
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.stranded = ()
    with pytest.raises(TypeError):
        out.cpu_reasons["x"] = "y"
    assert set(out.tags.values()) == {p.tag for p in out.partitions}


def test_partition_functions_are_short():
    """Partitioning is named phases, none longer than about 60 lines."""
    import ast
    from pathlib import Path

    import edgeplug._partition as pkg

    long = []
    for path in Path(pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long.append(f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long
