"""Vulkan and WebGPU: graph breaks are reported with the backend's reason, and an
op kept whole is never left whole on the CPU (real lowerings, serialized)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edgeplug
from edgeplug._partition import op_name
from edgeplug.testing import program_cpu_ops, program_delegated_ops

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


#: webgpu refuses an op ExecuTorch's WebGPU runtime lacks before Vulkan's check is asked, and says so
WEBGPU_RUNTIME_LACKS = "ExecuTorch's WebGPU runtime does not implement "


@pytest.fixture(scope="module", params=BACKENDS)
def lowered(request):
    if not edgeplug.get_backend(request.param).availability().ok:
        pytest.skip(f"{request.param} cannot serialize here")
    return edgeplug.lower(GraphBreaks(), _inputs(), request.param)


def _backend(lowered) -> str:
    return lowered.report.backend


def test_unsupported_op_is_a_graph_break_with_its_reason(lowered):
    top = program_cpu_ops(lowered)
    assert "aten.atan2" in top
    rep = lowered.report
    assert rep.cpu_ops["aten.atan2.default"] == 1
    [atan2] = [c for c in rep.cpu_nodes if c.op == "aten.atan2.default"]
    if _backend(lowered) == "webgpu":
        assert atan2.reason.startswith(WEBGPU_RUNTIME_LACKS + "aten.atan2.default"), atan2.reason
    else:
        assert atan2.reason == "Vulkan: no operator implementation"
    # the break splits the delegated work in two: hardswish before, mul after
    assert len(rep.partitions) == 2
    assert "aten.mul.Tensor" in program_delegated_ops(lowered)
    assert "aten.atan2.default" in rep.to_table() and atan2.reason.split("(")[0].strip() in rep.to_table()


def test_kept_whole_op_the_backend_refuses_is_decomposed(lowered):
    top = program_cpu_ops(lowered)
    assert "aten.hardswish" not in top  # the float64 one was decomposed
    assert program_delegated_ops(lowered).count("aten.hardswish.default") == 1  # the float32 one is whole, delegated
    float64 = [c for c in lowered.report.cpu_nodes if c.op != "aten.atan2.default"]
    assert float64, "the decomposed float64 hardswish should be on the CPU"
    # each float64 node is refused for its dtype, or (webgpu) for an op its runtime lacks, never without a reason
    dtype = [c for c in float64 if not c.reason.startswith(WEBGPU_RUNTIME_LACKS)]
    assert dtype and all("torch.float64" in c.reason for c in dtype), float64
    if _backend(lowered) != "webgpu":
        assert dtype == float64
    assert lowered.report.kept_whole_on_cpu == []


def test_every_cpu_node_has_the_backend_reason(lowered):
    assert lowered.report.cpu_nodes
    prefixes = ("Vulkan: ", WEBGPU_RUNTIME_LACKS) if _backend(lowered) == "webgpu" else ("Vulkan: ",)
    assert all(c.reason.startswith(prefixes) for c in lowered.report.cpu_nodes), lowered.report.cpu_nodes


def test_executorch_alone_leaves_the_kept_whole_op_on_the_cpu():
    """What the core fixes: VulkanPartitioner keeps every hardswish whole, then refuses the float64 one."""
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    ep = torch.export.export(GraphBreaks(), _inputs())
    with pytest.raises(RuntimeError, match="was not decomposed or delegated"):
        to_edge_transform_and_lower(
            ep, partitioner=[VulkanPartitioner()], compile_config=EdgeCompileConfig(_check_ir_validity=False)
        )


class _RefuseFusedNorm:
    """A filter refusing the op the core's fusion created, as a backend refusing its dtype would."""

    @edgeplug.hookimpl
    def edgeplug_partitioner_filters(self):
        def fn(node, ctx):
            if ctx.stage == "partition" and op_name(node.target) == "et_vk.rms_norm.default":
                from edgeplug._partition import refuse

                return refuse("test refuses the fused norm")
            return None

        yield edgeplug.PartitionerFilter(backend="vulkan", name="refuse-fused-norm", fn=fn)


class Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.rand(8, generator=torch.Generator().manual_seed(0)) + 0.5)

    def forward(self, x):
        return F.rms_norm(x, (8,), self.w, 1e-6) * 2.0


@pytest.fixture
def fused_norm_program():
    """The edge program of Norm with the core's fusion applied: one et_vk.rms_norm."""
    from executorch.exir import EdgeCompileConfig, to_edge

    def make():
        ep = torch.export.export(Norm(), (torch.randn(2, 8),))
        edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
        fused, _ = edgeplug.fuse(edge, "vulkan")
        assert [n for n in fused.graph.nodes if op_name(n.target) == "et_vk.rms_norm.default"]
        return fused

    return make


def test_a_fused_op_left_on_the_cpu_is_stranded_with_its_reason(fused_norm_program, edgeplug_register):
    """Dry run: stranded like a kept-whole op left on the CPU (not an ordinary CPU node), and the dry run
    stops there as the real lowering does (it is as strict)."""
    from edgeplug._errors import LoweringError
    from edgeplug._partition import CorePartitioner

    ep = fused_norm_program()
    edgeplug_register(_RefuseFusedNorm(), name="refuse-fused-norm")
    part = CorePartitioner(edgeplug.get_backend("vulkan"), dry_run=True)
    with pytest.raises(LoweringError) as info:
        part.partition(ep)
    assert str(info.value) == part.stranded_message()
    [s] = part.stranded
    assert s.op == "et_vk.rms_norm.default"
    assert "rms_norm fusion" in s.reason and "refused by filter 'refuse-fused-norm': test refuses the fused norm" in s.reason
    assert s.node in part.stranded_message() and "cannot run there" in part.stranded_message()


def test_a_real_lowering_stops_before_serialization_on_a_stranded_fused_op(fused_norm_program, edgeplug_register):
    from edgeplug._errors import LoweringError
    from edgeplug._partition import CorePartitioner

    ep = fused_norm_program()
    baseline = CorePartitioner(edgeplug.get_backend("vulkan"))
    baseline.partition(fused_norm_program())
    assert baseline.stranded == [] and baseline.partitions  # delegated when nothing refuses it
    edgeplug_register(_RefuseFusedNorm(), name="refuse-fused-norm")
    part = CorePartitioner(edgeplug.get_backend("vulkan"))
    with pytest.raises(LoweringError, match=r"et_vk\.rms_norm\.default.*test refuses the fused norm"):
        part.partition(ep)
