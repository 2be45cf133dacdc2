"""Graph breaks carry the backend's reason, and no op is left whole on the CPU (real lowerings, serialized).

An op the backend keeps whole but refuses at one node (here: a dtype its table
does not take) is decomposed there, never left whole on the CPU where no
kernel runs it; a fused op the backend's filter refuses is stranded, and the
lowering (real or dry run, alike) stops with the reason before serializing.
The backends are the fixture backends (tests/fixtures/backends); the same
behaviour on a first-party partitioner is tested with its plugin.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edgeplug
from edgeplug.plugin import op_name
from edgeplug.testing import program_cpu_ops, program_delegated_ops

D = 8


class GraphBreaks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.rand(D, generator=torch.Generator().manual_seed(0)) + 0.5)

    def forward(self, x, y, d):
        h = F.rms_norm(x, (D,), self.w, 1e-6)  # kept whole, delegated
        b = torch.atan2(h, y)  # not in the table: the graph breaks here
        c = F.rms_norm(d, (D,), None, 1e-6)  # float64: the table refuses the dtype, so it must not stay whole
        return b * 2.0, c


def _inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(4, D, generator=g), torch.randn(4, D, generator=g), torch.randn(4, D, generator=g, dtype=torch.float64))


@pytest.fixture(scope="module")
def lowered():
    from edgeplug_fixture_backends import KEEP, registered

    with registered():
        return edgeplug.lower(GraphBreaks(), _inputs(), KEEP)


def test_unsupported_op_is_a_graph_break_with_its_reason(lowered):
    assert "aten.atan2" in program_cpu_ops(lowered)
    rep = lowered.report
    assert rep.cpu_ops["aten.atan2.default"] == 1
    [atan2] = [c for c in rep.cpu_nodes if c.op == "aten.atan2.default"]
    assert atan2.reason == "aten.atan2.default is not in the fixture-keep support table"
    # the break splits the delegated work in two: the norm before, the multiply after
    assert len(rep.partitions) == 2
    assert "aten.mul.Tensor" in program_delegated_ops(lowered)
    assert "aten.atan2.default" in rep.to_table() and "is not in the fixture-keep support table" in rep.to_table()


def test_kept_whole_op_the_backend_refuses_is_decomposed(lowered):
    assert "aten.rms_norm" not in program_cpu_ops(lowered)  # the float64 one was decomposed
    assert program_delegated_ops(lowered).count("aten.rms_norm.default") == 1  # the float32 one is whole, delegated
    float64 = [c for c in lowered.report.cpu_nodes if c.op != "aten.atan2.default"]
    assert float64, "the decomposed float64 norm should be on the CPU"
    assert all("torch.float64" in c.reason for c in float64), float64
    assert lowered.report.kept_whole_on_cpu == []


class _RefuseFusedNorm:
    """A filter refusing the op the core's fusion created, as a backend refusing its dtype would."""

    def __init__(self, op: str, backend: str) -> None:
        self.op, self.backend = op, backend

    @edgeplug.hookimpl
    def edgeplug_partitioner_filters(self):
        def fn(node, ctx):
            if ctx.stage == "partition" and op_name(node.target) == self.op:
                from edgeplug.plugin import refuse

                return refuse("test refuses the fused norm")
            return None

        yield edgeplug.PartitionerFilter(backend=self.backend, name="refuse-fused-norm", fn=fn)


class Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.rand(D, generator=torch.Generator().manual_seed(0)) + 0.5)

    def forward(self, x):
        return F.rms_norm(x, (D,), self.w, 1e-6) * 2.0


@pytest.fixture
def fused_norm_program(fixture_backends):
    """The edge program of Norm with the core's fusion applied: one fused op of fixture-fused."""
    from executorch.exir import EdgeCompileConfig, to_edge

    op = f"{fixture_backends.FUSED_OP}.default"

    def make():
        ep = torch.export.export(Norm(), (torch.randn(2, D),))
        edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
        fused, _ = edgeplug.fuse(edge, fixture_backends.FUSED)
        assert [n for n in fused.graph.nodes if op_name(n.target) == op]
        return fused

    return make


def test_a_fused_op_left_on_the_cpu_is_stranded_with_its_reason(fused_norm_program, edgeplug_register, fixture_backends):
    """Dry run: stranded like a kept-whole op left on the CPU (not an ordinary CPU node), and the dry run
    stops there as the real lowering does (it is as strict)."""
    from edgeplug._errors import LoweringError
    from edgeplug._partition import CorePartitioner

    fb = fixture_backends
    ep = fused_norm_program()
    edgeplug_register(_RefuseFusedNorm(f"{fb.FUSED_OP}.default", fb.FUSED), name="refuse-fused-norm")
    part = CorePartitioner(edgeplug.get_backend(fb.FUSED), dry_run=True)
    with pytest.raises(LoweringError) as info:
        part.partition(ep)
    assert str(info.value) == part.stranded_message()
    [s] = part.stranded
    assert s.op == f"{fb.FUSED_OP}.default"
    assert "rms_norm fusion" in s.reason and "refused by filter 'refuse-fused-norm': test refuses the fused norm" in s.reason
    assert s.node in part.stranded_message() and "cannot run there" in part.stranded_message()


def test_a_real_lowering_stops_before_serialization_on_a_stranded_fused_op(
    fused_norm_program, edgeplug_register, fixture_backends
):
    from edgeplug._errors import LoweringError
    from edgeplug._partition import CorePartitioner

    fb = fixture_backends
    ep = fused_norm_program()
    baseline = CorePartitioner(edgeplug.get_backend(fb.FUSED))
    baseline.partition(fused_norm_program())
    assert baseline.stranded == [] and baseline.partitions  # delegated when nothing refuses it
    edgeplug_register(_RefuseFusedNorm(f"{fb.FUSED_OP}.default", fb.FUSED), name="refuse-fused-norm")
    part = CorePartitioner(edgeplug.get_backend(fb.FUSED))
    with pytest.raises(LoweringError, match=r"edgeplug_fixture\.rms_norm\.default.*test refuses the fused norm"):
        part.partition(ep)
