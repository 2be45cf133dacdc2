"""Vulkan and WebGPU: graph breaks are reported with the backend's reason, and an
op kept whole is never left whole on the CPU (real lowerings, serialized)."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edgeplug
from edgeplug.partition import op_name

# webgpu shares Vulkan's partitioner and serialization: the second lowering is the slow extra
BACKENDS = ["vulkan", pytest.param("webgpu", marks=pytest.mark.slow)]


class GraphBreaks(nn.Module):
    def forward(self, x, y, d):
        h = F.hardswish(x)  # kept whole, delegated
        b = torch.atan2(h, y)  # no Vulkan shader: the graph breaks here
        c = F.hardswish(d)  # float64: Vulkan refuses the dtype, so it must not be kept whole
        return b * 2.0, c


def _inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g, dtype=torch.float64))


@pytest.fixture(scope="module", params=BACKENDS)
def lowered(request):
    if not edgeplug.get_backend(request.param).availability().ok:
        pytest.skip(f"{request.param} cannot serialize here")
    return edgeplug.lower(GraphBreaks(), _inputs(), request.param)


def _base(op: str) -> str:
    """'aten.atan2.out' -> 'aten.atan2': serialization turns ops into their out variants."""
    return op.rsplit(".", 1)[0]


def _top_level_ops(result) -> list[str]:
    """Ops of the serialized program's top-level graph (what the CPU runs)."""
    gm = result.program.exported_program().graph_module
    return [
        _base(op_name(n.target))
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target is not operator.getitem and "call_delegate" not in str(n.target)
    ]


def _delegated_ops(result) -> list[str]:
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    gm = result.program.exported_program().graph_module
    return [
        op_name(n.target)
        for _, lowered, _ in get_lowered_submodules(gm)
        for n in lowered.original_module.graph.nodes
        if n.op == "call_function"
    ]


def test_unsupported_op_is_a_graph_break_with_its_reason(lowered):
    top = _top_level_ops(lowered)
    assert "aten.atan2" in top
    rep = lowered.report
    assert rep.cpu_ops["aten.atan2.default"] == 1
    [atan2] = [c for c in rep.cpu_nodes if c.op == "aten.atan2.default"]
    assert atan2.reason == "Vulkan: no operator implementation"
    # the break splits the delegated work in two: hardswish before, mul after
    assert len(rep.partitions) == 2
    assert "aten.mul.Tensor" in _delegated_ops(lowered)
    assert "aten.atan2.default" in rep.to_table() and "no operator implementation" in rep.to_table()


def test_kept_whole_op_the_backend_refuses_is_decomposed(lowered):
    top = _top_level_ops(lowered)
    assert "aten.hardswish" not in top  # the float64 one was decomposed
    assert _delegated_ops(lowered).count("aten.hardswish.default") == 1  # the float32 one is whole, delegated
    float64 = [c for c in lowered.report.cpu_nodes if c.op != "aten.atan2.default"]
    assert float64, "the decomposed float64 hardswish should be on the CPU"
    assert all("torch.float64" in c.reason for c in float64), float64
    assert lowered.report.kept_whole_on_cpu == []


def test_every_cpu_node_has_the_backend_reason(lowered):
    assert lowered.report.cpu_nodes
    assert all(c.reason.startswith("Vulkan: ") for c in lowered.report.cpu_nodes)


def test_executorch_alone_leaves_the_kept_whole_op_on_the_cpu():
    """What the core fixes: VulkanPartitioner keeps every hardswish whole, then refuses the float64 one."""
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    ep = torch.export.export(GraphBreaks(), _inputs())
    with pytest.raises(RuntimeError, match="was not decomposed or delegated"):
        to_edge_transform_and_lower(
            ep, partitioner=[VulkanPartitioner()], compile_config=EdgeCompileConfig(_check_ir_validity=False)
        )
