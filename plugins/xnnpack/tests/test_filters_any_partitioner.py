"""Partitioner filters hold with any executorch partitioner (XNNPACK's here).

The core asks the backend's partitioner which nodes it supports, applies the
filters, and forms the partitions itself, so a refusal in the middle of what
the partitioner grouped never leaves a dependency cycle. The report keeps both
the filter's reason and the partitioner's own.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import edgeplug
from edgeplug import PartitionerFilter
from edgeplug._graph.ops import qualified_name
from edgeplug._partition import refuse

NO_DIV = "no-div"
RANK = "rank-at-most-3"


def no_div(node, ctx):
    """Plain False: refused, the report names the filter."""
    if node.op == "call_function" and qualified_name(node.target) == "aten::div":
        return False
    return None


def rank_at_most_3(node, ctx):
    """A refusal with the filter's own reason."""
    val = node.meta.get("val")
    if node.op == "call_function" and isinstance(val, torch.Tensor) and val.dim() > 3:
        return refuse(f"rank {val.dim()} > 3")
    return None


class _Filters:
    @edgeplug.hookimpl
    def edgeplug_partitioner_filters(self):
        yield PartitionerFilter(backend="xnnpack", name=NO_DIV, fn=no_div)
        yield PartitionerFilter(backend="xnnpack", name=RANK, fn=rank_at_most_3)


class DivInTheMiddle(nn.Module):
    """linear -> (div, add) -> mul: one XNNPACK partition; without div it depends on itself."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, y):
        h = self.lin(x)
        return (h / y) * (h + 1.0)


def _inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(2, 8, generator=g), torch.rand(2, 8, generator=g) + 1.0)


def _xnnpack_or_skip():
    if "xnnpack" not in edgeplug.backends():
        pytest.skip("xnnpack plugin not installed")


def test_a_refusal_inside_a_partition_leaves_no_cycle(edgeplug_register):
    _xnnpack_or_skip()
    edgeplug_register(_Filters(), name="test-filters")
    result = edgeplug.lower(DivInTheMiddle().eval(), _inputs(), "xnnpack", verify=True)
    rep = result.report
    assert rep.verification.max_abs_diff <= 1e-5
    [div] = [c for c in rep.cpu_nodes if c.op == "aten.div.Tensor"]
    assert div.reason == f"refused by filter {NO_DIV!r}"
    delegated = {op for p in rep.partitions for op in p.ops}
    assert {"aten.linear.default", "aten.mul.Tensor"} <= delegated and "aten.div.Tensor" not in delegated
    # the partitioner's one group became two partitions around the CPU div
    assert len(rep.partitions) == 2


def test_without_the_core_forming_partitions_executorch_finds_a_cycle():
    """What the core fixes: taking a tag back out of XNNPACK's partition makes it invalid."""
    _xnnpack_or_skip()
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    class DropDiv(XnnpackPartitioner):
        def partition(self, ep):
            result = super().partition(ep)
            for node in ep.graph.nodes:
                if node.op == "call_function" and qualified_name(node.target) == "aten::div":
                    node.meta.pop("delegation_tag", None)
            return result

    ep = torch.export.export(DivInTheMiddle().eval(), _inputs())
    with pytest.raises(AssertionError, match="dependency cycles"):
        to_edge_transform_and_lower(ep, partitioner=[DropDiv()])


def test_a_filter_may_give_its_reason_and_partitioner_reasons_survive(edgeplug_register):
    _xnnpack_or_skip()
    edgeplug_register(_Filters(), name="test-filters")

    class Rank4(nn.Module):
        def forward(self, x):
            return (x * 2.0).mean(dim=-1) + 1.0

    rep = edgeplug.lower(Rank4(), (torch.randn(1, 2, 3, 4),), "xnnpack", dry_run=True).report
    reasons = {c.op: c.reason for c in rep.cpu_nodes}
    assert reasons["aten.mul.Tensor"] == f"refused by filter {RANK!r}: rank 4 > 3"


def _xnnpack_partitioner():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner()


class _FilteredXnnpack:
    """A third party's backend over XnnpackPartitioner with both filters and no passes.

    (The xnnpack plugin's own pass turns llama's division by a power of two into
    a multiply, which would leave the div filter nothing to refuse.)
    """

    @edgeplug.hookimpl
    def edgeplug_backends(self):
        yield edgeplug.BackendSpec(
            backend="xnnpack-filtered", description="XNNPACK with two filters", backend_id="XnnpackBackend",
            partitioner=_xnnpack_partitioner, verify_method="pte",
        )

    @edgeplug.hookimpl
    def edgeplug_partitioner_filters(self):
        yield PartitionerFilter(backend="xnnpack-filtered", name=NO_DIV, fn=no_div)
        yield PartitionerFilter(backend="xnnpack-filtered", name=RANK, fn=rank_at_most_3)


@pytest.mark.slow
def test_llama_lowers_and_verifies_with_both_filters(edgeplug_register):
    _xnnpack_or_skip()
    from edgeplug.examples import load_model

    edgeplug_register(_FilteredXnnpack(), name="test-filtered-xnnpack")
    model, inputs, _, _ = load_model("llama")
    rep = edgeplug.lower(model, inputs, "xnnpack-filtered", verify=True).report
    assert rep.verification.max_abs_diff <= 1e-4, rep.to_table()
    delegated = {op for p in rep.partitions for op in p.ops}
    assert "aten.div.Tensor" not in delegated and rep.partitions
    reasons = [c.reason for c in rep.cpu_nodes]
    assert any(r == f"refused by filter {NO_DIV!r}" for r in reasons)
    assert any(r.startswith(f"refused by filter {RANK!r}: rank 4 > 3") for r in reasons)
    # XNNPACK's own reason, not "it gave no reason"
    assert any("mean.dim only supports averaging 4D tensors" in r for r in reasons), reasons
    assert not any("it gave no reason" in r for r in reasons)
    table = rep.to_table()
    assert NO_DIV in table and RANK in table


class _RuntimeWeightConv(torch.nn.Module):
    def forward(self, x, w):
        return torch.nn.functional.conv2d(x, w)


def test_the_partitioners_logged_reason_is_the_cpu_nodes_reason():
    """XNNPACK logs why it refuses a node at DEBUG; the report reads it, whatever the logging setup."""
    _xnnpack_or_skip()
    import logging

    inputs = (torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3))
    [conv] = edgeplug.lower(_RuntimeWeightConv(), inputs, "xnnpack").report.cpu_nodes
    assert conv.reason == "Expected weight to be a static param"

    root = logging.getLogger()
    saved = root.level
    root.setLevel(logging.ERROR)  # a quiet application: the reason still reaches the report
    try:
        [conv] = edgeplug.lower(_RuntimeWeightConv(), inputs, "xnnpack").report.cpu_nodes
        assert conv.reason == "Expected weight to be a static param"
        logging.disable(logging.WARNING)  # drops every record: the report says why it has no reason
        [conv] = edgeplug.lower(_RuntimeWeightConv(), inputs, "xnnpack").report.cpu_nodes
        assert "logging.disable(WARNING) is in effect" in conv.reason
    finally:
        logging.disable(logging.NOTSET)
        root.setLevel(saved)
