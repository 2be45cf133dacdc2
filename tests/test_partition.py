"""The core partitioner: "kept whole" implies "delegated or decomposed", and every
node left on the CPU carries the reason the backend gave."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import edgeplug
from edgeplug import PartitionerFilter
from edgeplug._errors import EdgeplugError
from edgeplug._partition import CorePartitioner, SupportTablePartitioner


class MatmulAndDouble(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x, d):
        return torch.matmul(x, self.w).relu(), torch.nn.functional.linear(d, d)


def _inputs():
    return (torch.randn(2, 3, 8), torch.randn(4, 4, dtype=torch.float64))


def test_keep_whole_uses_the_partition_predicate():
    """matmul is in QNN's keep-whole table but not in its support table: it must be decomposed."""
    ep = torch.export.export(MatmulAndDouble(), _inputs())
    part = CorePartitioner(edgeplug.get_backend("qnn"), dry_run=True)
    ops, keep = part.ops_to_not_decompose(ep)
    assert torch.ops.aten.matmul.default in ops
    nodes = {n.name: n for n in ep.graph.nodes}
    assert keep(nodes["matmul"]) is False
    assert "not in the QNN (HTP) support table" in part.keep_decisions["matmul"].reason
    assert keep(nodes["linear"]) is False  # linear is supported, but not in float64
    assert "float64" in part.keep_decisions["linear"].reason


@pytest.fixture(scope="module")
def qnn_matmul():
    return edgeplug.lower(MatmulAndDouble(), _inputs(), "qnn", dry_run=True)


def test_decomposed_matmul_is_delegated_not_left_whole(qnn_matmul):
    rep = qnn_matmul.report
    delegated = {op for p in rep.partitions for op in p.ops}
    top = {c.op for c in rep.cpu_nodes}
    assert "aten.matmul.default" not in delegated | top
    assert {"aten.bmm.default", "aten.relu.default"} <= delegated or {"aten.mm.default", "aten.relu.default"} <= delegated
    assert "aten.linear.default" not in delegated | top  # float64: decomposed, not stranded
    assert rep.kept_whole_on_cpu == []
    assert all("float64" in c.reason for c in rep.cpu_nodes), rep.cpu_nodes


def test_the_support_table_keeps_no_op_whole_that_the_backend_does_not_keep_whole():
    """The table's own ops_to_not_decompose once kept matmul whole with no filter (stranding it); now it keeps only the backend's keep-whole ops."""
    qnn = edgeplug.get_backend("qnn")
    qnn_table = qnn.make_partitioner()
    assert isinstance(qnn_table, SupportTablePartitioner)
    ops, check = qnn_table.ops_to_not_decompose(None)
    assert torch.ops.aten.matmul.default not in ops
    assert ops and set(ops) <= set(qnn.keep_whole), set(ops) - set(qnn.keep_whole)


class _RaisingFilter:
    @edgeplug.hookimpl
    def edgeplug_partitioner_filters(self):
        def fn(node, ctx):
            raise ValueError("boom")

        yield PartitionerFilter(backend="qnn", name="raises", fn=fn)


def test_a_filter_that_raises_is_named(edgeplug_register):
    edgeplug_register(_RaisingFilter(), name="raising-filter")
    ep = torch.export.export(MatmulAndDouble(), _inputs())
    part = CorePartitioner(edgeplug.get_backend("qnn"), dry_run=True)
    _, keep = part.ops_to_not_decompose(ep)
    node = next(n for n in ep.graph.nodes if n.name == "matmul")
    relu = next(n for n in ep.graph.nodes if n.name == "relu")  # supported: the filter is asked
    with pytest.raises(EdgeplugError, match=r"filter 'raises' \(\S+test_partition\.py:\d+\) of backend 'qnn' from plugin 'raising-filter'.*node 'relu'.*raised ValueError: boom at \S+test_partition\.py:\d+"):
        part.delegable(relu, part.context(ep, "before_decomposition"))
    # the support table said no first: the filter is not even asked for a refused node
    assert keep(node) is False


@pytest.mark.parametrize("backend", ["qnn", "samsung", "vulkan", "webgpu", "xnnpack"])
def test_examples_report_partitions_and_reasons(backend):
    """`edgeplug lower mlp --dry-run` on every backend: partitions, and a reason per CPU node."""
    if backend not in edgeplug.backends():
        pytest.skip(f"{backend} plugin not installed")
    from edgeplug.examples import load_model

    model, inputs, _, _ = load_model("mlp")
    rep = edgeplug.lower(model, inputs, backend, dry_run=True).report
    assert rep.partitions and rep.delegated_nodes > 0
    assert rep.kept_whole_on_cpu == []
    for c in rep.cpu_nodes:
        assert c.reason and "no reason recorded" not in c.reason, c


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["qnn", "samsung", "vulkan", "webgpu", "xnnpack"])
def test_llama_example_reports_every_graph_break(backend):
    from edgeplug.examples import load_model

    model, inputs, _, _ = load_model("llama")
    rep = edgeplug.lower(model, inputs, backend, dry_run=True).report
    assert rep.partitions
    assert rep.kept_whole_on_cpu == []
    assert sum(rep.cpu_ops.values()) == len(rep.cpu_nodes)
    for c in rep.cpu_nodes:
        assert c.reason and "no reason recorded" not in c.reason, c


def test_support_check_is_the_backends_own_with_its_reasons():
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
    vulkan = support_check(edgeplug.get_backend("vulkan"), ep.graph_module)
    assert vulkan(atan2) == Verdict(False, "Vulkan: no operator implementation")
    # webgpu reuses the vulkan plugin's check, on the Vulkan partitioner its own wraps
    assert edgeplug.get_backend("webgpu").spec.support_check is edgeplug.get_backend("vulkan").spec.support_check
    assert support_check(edgeplug.get_backend("webgpu"), ep.graph_module)(atan2) == Verdict(False, "Vulkan: no operator implementation")
    qnn = support_check(edgeplug.get_backend("qnn"))
    assert not qnn(atan2) and "not in the QNN (HTP) support table" in qnn(atan2).reason
    assert all(isinstance(qnn(n), Verdict) for n in calls)
    # aten nodes (before decomposition) are presented to the check as edge ops
    aten_atan2 = next(n for n in aten.graph.nodes if "atan2" in str(n.target))
    assert support_check(edgeplug.get_backend("vulkan"))(aten_atan2) == Verdict(False, "Vulkan: no operator implementation")
    assert support_check(edgeplug.get_backend("xnnpack")) is None  # XNNPACK states support only by tagging


def test_partition_outcome_is_frozen():
    import dataclasses

    part = CorePartitioner(edgeplug.get_backend("qnn"), dry_run=True)
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
