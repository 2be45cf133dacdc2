"""HTP's constant-only rule, checked on the partitioned graph itself (no QNN SDK).

QNN cannot serialize here, so every lowering is a dry run: the core partitions
a real ``to_edge`` program with the SDK-free support table and records which
nodes it would delegate (``report.partitions``) and which stay in the
top-level graph (``report.cpu_nodes``).
"""

from __future__ import annotations

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)
import torch.nn.functional as F
from torch import nn

import edgeplug
from edgeplug._errors import LoweringError
from edgeplug import PartitionerFilter, PassSpec

QDQ = torch.ops.quantized_decomposed


def _dq(wq, scales, zp):
    return QDQ.dequantize_per_channel_group(wq, scales, zp, -8, 7, torch.int8, 8, torch.float32)


class HtpModel(nn.Module):
    """Every case at once: one lowering for all the layout checks."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("table", torch.randn(4, 32, generator=g))
        self.w_const = nn.Parameter(torch.randn(16, 32, generator=g))
        self.w_run = nn.Parameter(torch.randn(16, 32, generator=g))
        for name in ("wq_run", "wq_const"):
            self.register_buffer(name, torch.randint(-8, 8, (16, 32), generator=g, dtype=torch.int8))
        self.register_buffer("scales", torch.rand(16, 4, generator=g) + 0.01)
        self.register_buffer("zp", torch.zeros(16, 4, dtype=torch.int8))

    def forward(self, x):
        const = F.linear(self.table, self.w_const)  # constant-only: decomposed, CPU
        run = F.linear(x, self.w_run)  # reads x: kept whole, delegated
        run_q = F.linear(x, _dq(self.wq_run, self.scales, self.zp))  # weight dequantize travels with it
        return run + const + run_q


def _lower(model=None):
    model = model or HtpModel().eval()
    return edgeplug.lower(model, (torch.randn(4, 32),), "qnn", dry_run=True)


def layout(result):
    """(delegated op counts, top-level op counts, top-level node -> reason)."""
    rep = result.report
    delegated: dict[str, int] = {}
    for p in rep.partitions:
        for op, n in p.ops.items():
            delegated[op] = delegated.get(op, 0) + n
    top = {c.op: 0 for c in rep.cpu_nodes}
    for c in rep.cpu_nodes:
        top[c.op] += 1
    return delegated, top, {c.node: c.reason for c in rep.cpu_nodes}


def assert_htp_layout(result) -> None:
    """The layout the constant-only rule must produce for HtpModel."""
    delegated, top, reasons = layout(result)
    rep = result.report
    # linear(x, w) and linear(x, dq(wq)) stay whole, inside a delegate
    assert delegated.get("aten.linear.default") == 2, delegated
    assert delegated.get("quantized_decomposed.dequantize_per_channel_group.default") == 1, delegated
    # the constant branches: decomposed (no linear at top level), wholly on the CPU
    assert "aten.linear.default" not in top, top
    assert top.get("aten.mm.default") == 1 and top.get("aten.permute_copy.default") == 1, top
    assert "aten.mm.default" not in delegated and "aten.permute_copy.default" not in delegated, delegated
    # the adds read x: delegated, so the constant branch is not left alone on the CPU
    assert delegated.get("aten.add.Tensor") == 2 and "aten.add.Tensor" not in top
    assert len(rep.partitions) == 1
    for node, reason in reasons.items():
        assert reason.startswith("constant-only"), (node, reason)
    assert rep.kept_whole_on_cpu == []


@pytest.fixture(scope="module")
def htp():
    return _lower()


def test_constant_branch_on_cpu_decomposed_rest_delegated(htp):
    assert_htp_layout(htp)


def test_edge_graph_has_no_constant_linear(htp):
    # the graph itself: two linears survive decomposition (the runtime ones), not three, and
    # both are inside the delegate (a dry run lowers to a stand-in, so its graph is there)
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    def linears(gm):
        return [n for n in gm.graph.nodes if n.op == "call_function" and "linear" in str(n.target)]

    gm = htp.edge.exported_program().graph_module
    assert linears(gm) == []
    inside = [n for _, lm, _ in get_lowered_submodules(gm) for n in linears(lm.original_module.graph_module)]
    assert len(inside) == 2


def test_report_names_the_reason(htp):
    text = htp.report.to_table()
    assert "constant-only: reads no runtime input" in text
    assert "aten.mm.default" in text


@pytest.fixture(scope="module")
def keep_whole():
    """The keep-whole filter the core hands to_edge, on the aten program."""
    from edgeplug._partition import CorePartitioner

    ep = torch.export.export(HtpModel().eval(), (torch.randn(4, 32),))
    part = CorePartitioner(edgeplug.get_backend("qnn"), dry_run=True)
    ops, fn = part.ops_to_not_decompose(ep)
    nodes = {n.name: n for n in ep.graph.nodes}
    return ops, fn, nodes


def test_keep_whole_filter(keep_whole):
    ops, fn, nodes = keep_whole
    assert torch.ops.aten.linear.default in ops
    assert QDQ.dequantize_per_channel_group.default in ops
    assert fn(nodes["linear"]) is False  # linear(table, w): constant-only, decomposed
    assert fn(nodes["linear_1"]) is True  # linear(x, w)
    assert fn(nodes["linear_2"]) is True  # linear(x, dq(wq))
    dqs = [n for name, n in nodes.items() if name.startswith("dequantize_per_channel_group")]
    assert len(dqs) == 1 and fn(dqs[0]) is True  # stays whole, with the linear that reads it


class ConstantGroupDequantize(nn.Module):
    """linear(table, dq(wq)): constant-only through a group dequantize, which no runtime kernel
    runs on the CPU (executorch has no out variant of dequantize_per_channel_group)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("table", torch.randn(4, 32, generator=g))
        self.register_buffer("wq", torch.randint(-8, 8, (16, 32), generator=g, dtype=torch.int8))
        self.register_buffer("scales", torch.rand(16, 4, generator=g) + 0.01)
        self.register_buffer("zp", torch.zeros(16, 4, dtype=torch.int8))

    def forward(self, x):
        return x + F.linear(self.table, _dq(self.wq, self.scales, self.zp))


def test_a_dry_run_fails_where_the_real_lowering_could_not_serialize():
    """The dry run serializes (in memory) as the real flow does: a group dequantize left on the
    CPU has no out variant, and the dry run says so in the stage the real lowering would."""
    with pytest.raises(LoweringError) as info:
        edgeplug.lower(ConstantGroupDequantize().eval(), (torch.randn(4, 16),), "qnn", dry_run=True)
    assert info.value.lowering_stage == "serialize .pte"
    assert "dequantize_per_channel_group" in str(info.value)


class _DecomposeEverything:
    @edgeplug.hookimpl
    def edgeplug_partitioner_filters(self):
        yield PartitionerFilter(backend="qnn", name="decompose-everything", fn=lambda node, ctx: False)


def test_a_filter_that_decomposes_everything_fails_the_check(edgeplug_register):
    edgeplug_register(_DecomposeEverything(), name="decompose-everything")
    # nothing is delegated any more: the group dequantize stays on the CPU, where no kernel runs
    # it, and the dry run fails where the real lowering would (serialization)
    with pytest.raises(LoweringError) as info:
        _lower()
    assert info.value.lowering_stage == "serialize .pte"


def test_a_partition_that_splits_the_constant_branch_fails_the_check(monkeypatch):
    # a non-transitive analysis (only direct readers of weights count): the
    # permute of w stays on the CPU but the mm after it is delegated
    import edgeplug._graph

    real = edgeplug._graph.constant_only_nodes

    def shallow(ep):
        return frozenset(
            n for n in real(ep) if n.op != "call_function" or all(a.op != "call_function" for a in n.all_input_nodes)
        )

    import edgeplug._partition.adapter

    monkeypatch.setattr(edgeplug._graph, "constant_only_nodes", shallow)
    monkeypatch.setattr(edgeplug._partition.adapter, "constant_only_nodes", shallow)  # it imported the name
    wrong = _lower()
    delegated, top, _ = layout(wrong)
    assert delegated.get("aten.mm.default") and top.get("aten.permute_copy.default")  # split
    with pytest.raises(AssertionError):
        assert_htp_layout(wrong)


class _RebuildConstantLinear:
    """An edge pass that recomposes the constant permute+mm into a linear (as executorch's
    recompose passes do): a kept-whole op the partition then leaves on the CPU."""

    @edgeplug.hookimpl
    def edgeplug_passes(self):
        def rebuild(ep):
            from executorch.exir.dialects._ops import ops as exir_ops

            g = ep.graph_module.graph
            for mm in [n for n in g.nodes if n.target == exir_ops.edge.aten.mm.default]:
                lhs, perm = mm.args
                if perm.target != exir_ops.edge.aten.permute_copy.default or lhs.op != "placeholder":
                    continue
                with g.inserting_before(mm):
                    lin = g.call_function(exir_ops.edge.aten.linear.default, (lhs, perm.args[0]))
                lin.meta = dict(mm.meta)
                mm.replace_all_uses_with(lin)
                g.erase_node(mm)
                g.erase_node(perm)
            ep.graph_module.recompile()

        yield PassSpec(backend="qnn", stage="edge", name="rebuild-constant-linear", fn=rebuild)


class ConstLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(4, 32))
        self.w = nn.Parameter(torch.randn(16, 32))

    def forward(self, x):
        return x + F.linear(self.table, self.w)


def test_kept_whole_op_a_pass_rebuilds_on_the_cpu_fails_naming_the_pass(edgeplug_register):
    baseline = edgeplug.lower(ConstLinear(), (torch.randn(4, 16),), "qnn", dry_run=True)
    assert baseline.report.kept_whole_on_cpu == []
    edgeplug_register(_RebuildConstantLinear(), name="rebuild-constant-linear")
    # the dry run is as strict as a real lowering: the linear the pass made after decomposition
    # cannot stay on the CPU, and the error blames the pass that made it, not executorch
    with pytest.raises(LoweringError) as info:
        edgeplug.lower(ConstLinear(), (torch.randn(4, 16),), "qnn", dry_run=True)
    msg = str(info.value)
    assert "aten.linear.default" in msg
    assert "edge-stage pass 'rebuild-constant-linear' of backend 'qnn'" in msg
    assert "executorch's own" not in msg
