"""The QNN backend refuses an ``aten.rms_norm`` over more than one axis.

QNN's RmsNorm op builder normalises the last axis only; given a
``normalized_shape`` of two dims it warns and builds nothing. The plugin's
partitioner filter refuses such a node, so it is decomposed before to_edge
(its mean, rsqrt and multiplies are taken one by one) while a one-axis
``rms_norm`` stays whole and is delegated. Dry runs: no QNN SDK needed.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edgeplug

FILTER = "qnn-rms-norm-last-axis-only"
RMS_NORM = "aten.rms_norm.default"


class TwoNorms(nn.Module):
    """One rms_norm over the last two axes (4, 8), one over the last axis (8,)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w2 = nn.Parameter(torch.rand(4, 8, generator=g) + 0.5)
        self.w1 = nn.Parameter(torch.rand(8, generator=g) + 0.5)

    def forward(self, x):
        return F.rms_norm(x, (4, 8), self.w2, 1e-6) + F.rms_norm(x, (8,), self.w1, 1e-6)


def _inputs():
    return (torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(1)),)


@pytest.fixture(scope="module")
def lowered():
    return edgeplug.lower(TwoNorms().eval(), _inputs(), "qnn", dry_run=True)


@pytest.fixture(scope="module")
def aten_program():
    return torch.export.export(TwoNorms().eval(), _inputs())


def _rms_norms(ep):
    """name -> node, for every rms_norm of ``ep``, and its normalized_shape."""
    return {n.name: n for n in ep.graph.nodes if n.op == "call_function" and "rms_norm" in str(n.target)}


def test_two_axis_rms_norm_is_not_kept_whole_and_one_axis_is(aten_program):
    from edgeplug._partition import CorePartitioner

    part = CorePartitioner(edgeplug.get_backend("qnn"), dry_run=True)
    ops, keep = part.ops_to_not_decompose(aten_program)
    assert torch.ops.aten.rms_norm.default in ops
    norms = _rms_norms(aten_program)
    by_axes = {len(n.args[1]): n for n in norms.values()}
    assert sorted(by_axes) == [1, 2]
    assert keep(by_axes[2]) is False
    assert part.keep_decisions[by_axes[2].name].reason == f"refused by filter {FILTER!r}"
    assert keep(by_axes[1]) is True


def test_lowering_decomposes_the_two_axis_norm_and_delegates_the_other(lowered):
    rep = lowered.report
    # exactly one rms_norm survives to_edge, the one-axis one, and it is delegated (the dry run
    # lowers the partition to a stand-in: the graph the delegate gets is there to read)
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    gm = lowered.edge.exported_program().graph_module
    assert _rms_norms(lowered.edge.exported_program()) == {}  # none on the CPU
    edge_norms = [n for _, lm, _ in get_lowered_submodules(gm) for n in _rms_norms(lm.original_module).values()]
    assert [list(n.args[1]) for n in edge_norms] == [[8]]
    assert rep.delegated_ops.get(RMS_NORM) == 1
    assert RMS_NORM not in rep.cpu_ops and rep.kept_whole_on_cpu == []
    # the two-axis norm became the ops it is made of, reducing over both axes
    assert rep.delegated_ops.get("aten.mean.dim") == 1
    assert rep.delegated_ops.get("aten.rsqrt.default") == 1


def test_report_says_why_the_two_axis_norm_is_not_one_op(lowered):
    fusions = {f.outcome: f for f in lowered.report.fusions}
    assert sorted(f.outcome for f in lowered.report.fusions) == ["fused", "rejected"]
    assert fusions["fused"].weight is not None  # the one-axis norm keeps its weight
    reason = fusions["rejected"].reason
    assert "spans 2 axes" in reason and "only the last axis is fused" in reason, reason
    assert reason in lowered.report.to_table()


def test_report_lists_the_norm_decomposed_instead_of_kept_whole_with_the_filter(lowered):
    rep = lowered.report
    assert [(c.op, c.reason) for c in rep.decomposed_instead] == [(RMS_NORM, f"refused by filter {FILTER!r}")]
    table = rep.to_table()
    assert "decomposed instead of kept whole: 1 nodes" in table
    assert f"refused by filter {FILTER!r}" in table


def test_filter_refuses_an_edge_dialect_two_axis_rms_norm(aten_program):
    # a pass that recomposed a two-axis norm after to_edge must not get it delegated either
    from executorch.exir import EdgeCompileConfig, to_edge

    from edgeplug._partition import CorePartitioner

    edge = to_edge(
        aten_program,
        compile_config=EdgeCompileConfig(_check_ir_validity=False, preserve_ops=[torch.ops.aten.rms_norm.default]),
    ).exported_program()
    norms = _rms_norms(edge)
    assert len(norms) == 2
    part = CorePartitioner(edgeplug.get_backend("qnn"), dry_run=True)
    ctx = part.context(edge, "partition")
    verdicts = {len(n.args[1]): part.delegable(n, ctx) for n in norms.values()}
    assert not verdicts[2] and verdicts[2].reason == f"refused by filter {FILTER!r}"
    assert verdicts[1]
