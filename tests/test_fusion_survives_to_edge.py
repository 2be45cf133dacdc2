"""A fusion's record says what the lowered program holds: a fused aten op that to_edge would decompose
again is not made, and one the partitioner then refuses to keep whole is reported as undone.

The backend here is what docs/writing-a-backend.md's first example builds: an executorch partitioner
with no per-node support check (executorch's demo partitioner of adds and matmuls, which takes no norm)
and an ``aten.rms_norm`` fusion policy. Each case counts the ``aten.rms_norm`` nodes of the lowered
program (inside delegates and out) against the records that claim a fusion.
"""

from __future__ import annotations

import pytest
import torch

import edgeplug
from edgeplug.plugin import BackendSpec, FusionPolicy, KeepWhole

import edgeplug_fixture_backends as fb

NAME = "undone-npu"
NORMS = 2


class _Norms(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w2 = torch.nn.Parameter(1 + 0.1 * torch.randn(16)), torch.nn.Parameter(1 + 0.1 * torch.randn(16))
        self.proj = torch.nn.Linear(16, 16)

    @staticmethod
    def _norm(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    def forward(self, x):
        return self._norm(self.proj(self._norm(x, self.w1)), self.w2) @ self.proj.weight


def _asks_per_node():
    """The demo partitioner keeping aten.rms_norm whole itself, with a keep-whole check of its own (as many executorch
    partitioners have) that refuses every norm (a partitioner's check answers for the ops of its own list only)."""
    from executorch.exir.backend.test.op_partitioner_demo import AddMulPartitionerDemo

    class AsksPerNode(AddMulPartitionerDemo):
        def ops_to_not_decompose(self, ep):
            return [torch.ops.aten.rms_norm.default], lambda node: "rms_norm" not in str(node.target)

    return AsksPerNode()


class _Plugin:
    def __init__(self, keep_whole: bool, partitioner=fb.stock_partitioner) -> None:
        self.keep_whole, self.partitioner = keep_whole, partitioner

    @edgeplug.hookimpl
    def edgeplug_backends(self):
        yield BackendSpec(backend=NAME, description="a partitioner with no norm and no support check (a test backend)",
                          backend_id="BackendWithCompilerDemo", partitioner=self.partitioner)

    @edgeplug.hookimpl
    def edgeplug_fusion_policies(self):
        yield FusionPolicy(backend=NAME, target="aten.rms_norm", dequantized_weights="keep")

    @edgeplug.hookimpl
    def edgeplug_keep_whole(self):
        if self.keep_whole:
            yield KeepWhole(backend=NAME, ops=(torch.ops.aten.rms_norm.default,))


def _rms_norm_nodes(result) -> int:
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    gm = result.edge.exported_program().graph_module
    graphs = [gm.graph, *(m.original_module.graph for _, m, _ in get_lowered_submodules(gm))]
    return sum(1 for g in graphs for n in g.nodes if n.op == "call_function" and "rms_norm" in str(n.target))


def _lower(edgeplug_register, keep_whole: bool, partitioner=fb.stock_partitioner):
    edgeplug_register(_Plugin(keep_whole, partitioner), name=f"undone-{keep_whole}")
    torch.manual_seed(0)
    model, x = _Norms().eval(), torch.randn(2, 4, 16)
    return edgeplug.lower(model, (x,), NAME, verify=False)


def test_a_fusion_into_an_op_the_backend_does_not_keep_whole_is_not_made(edgeplug_register):
    result = _lower(edgeplug_register, keep_whole=False)
    records = result.report.fusions
    assert len(records) == NORMS and _rms_norm_nodes(result) == 0
    for r in records:
        assert r.outcome == "rejected", r
        assert "to_edge would decompose aten.rms_norm again" in r.reason and "KeepWhole" in r.reason, r.reason
    assert "fused" not in result.report.to_table().split("fusions:", 1)[1].split("\n", 1)[0].replace("rejected", "")


def test_a_fused_op_the_partitioner_will_not_keep_whole_is_reported_undone(edgeplug_register):
    # kept whole by its record and the partitioner's list, but refused by the partitioner's own check: to_edge
    # decomposes it again
    result = _lower(edgeplug_register, keep_whole=True, partitioner=_asks_per_node)
    records = result.report.fusions
    assert len(records) == NORMS and _rms_norm_nodes(result) == 0
    assert {n.op for n in result.report.decomposed_instead} == {"aten.rms_norm.default"}
    claimed = [r for r in records if r.outcome != "rejected"]
    assert len(claimed) == _rms_norm_nodes(result) == 0, claimed
    assert all("decomposed again by to_edge" in r.reason for r in records), [r.reason for r in records]


def test_a_fused_op_kept_whole_that_the_partitioner_then_leaves_is_an_error_naming_the_fusion(edgeplug_register):
    # no check says no before decomposition, so the op is kept whole, and nothing on the CPU runs it
    with pytest.raises(edgeplug.LoweringError) as err:
        _lower(edgeplug_register, keep_whole=True)
    message = str(err.value)
    assert f"{NORMS} op(s) left on the CPU for backend '{NAME}'" in message and "aten.rms_norm.default" in message
    assert "created by a fusion" in message


def test_a_backend_that_keeps_and_takes_the_op_still_fuses(fixture_backends):
    torch.manual_seed(0)
    model, x = _Norms().eval(), torch.randn(2, 4, 16)
    result = edgeplug.lower(model, (x,), fixture_backends.KEEP, verify=False)
    fused = [r for r in result.report.fusions if r.outcome != "rejected"]
    assert len(fused) == NORMS == _rms_norm_nodes(result), result.report.fusions
