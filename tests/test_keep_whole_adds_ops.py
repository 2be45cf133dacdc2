"""A ``KeepWhole`` record adds ops beyond the partitioner's own ``ops_to_not_decompose`` list.

An executorch partitioner (most of its config-based ones) names the ops it keeps whole with a check for those ops; a
plugin's ``KeepWhole`` record adds others the partitioner delegates. Before, the partitioner's check was asked
about the added ops too, answered no (they are not its), and each node was decomposed "refused by the <Partitioner>
check", which read as the backend's verdict. Now the partitioner's check answers for its own ops only.
"""

from __future__ import annotations

import types

import torch
from executorch.exir.backend.partitioner import Partitioner

import edgeplug
import edgeplug_fixture_backends as fb  # tests/fixtures/backends (put on the path by conftest)
from edgeplug.examples import load_model
from edgeplug.plugin import BackendSpec, KeepWhole, hookimpl

NAME = "fixture-own-list"


class OwnListPartitioner(Partitioner):
    """The fixture table's partitioner behind a keep-whole list of its own (hardtanh) with a check that
    answers yes for those ops only, as executorch's config partitioners' checks do."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = fb.table_partitioner()
        self.delegation_spec = self.inner.delegation_spec

    def ops_to_not_decompose(self, ep):
        own = [torch.ops.aten.hardtanh.default]
        return own, lambda node: node.target in own

    def partition(self, exported_program):
        return self.inner.partition(exported_program)


def _plugin(keep_whole):
    @hookimpl
    def edgeplug_backends():
        yield BackendSpec(backend=NAME, description="a partitioner with its own keep-whole list (an edgeplug test backend)",
                          backend_id=fb.BACKEND_IDS[fb.TABLE], partitioner=OwnListPartitioner)

    @hookimpl
    def edgeplug_keep_whole():
        yield KeepWhole(backend=NAME, ops=keep_whole)

    return types.SimpleNamespace(edgeplug_backends=edgeplug_backends, edgeplug_keep_whole=edgeplug_keep_whole)


def _lower_mlp(edgeplug_register, keep_whole):
    edgeplug_register(_plugin(keep_whole), name="own-list")
    model, inputs, _, _ = load_model("mlp")
    return edgeplug.lower(model, inputs, NAME).report


def test_an_op_a_keep_whole_record_adds_is_kept_whole_and_delegated(edgeplug_register):
    report = _lower_mlp(edgeplug_register, (torch.ops.aten.linear.default,))
    assert report.decomposed_instead == [], [(c.op, c.reason) for c in report.decomposed_instead]
    assert report.delegated_ops.get("aten.linear.default") == 2, report.to_table()
    assert "check" not in report.to_table()


def test_without_the_record_the_same_op_is_decomposed(edgeplug_register):
    report = _lower_mlp(edgeplug_register, (torch.ops.aten.hardtanh.default,))
    assert "aten.linear.default" not in report.delegated_ops, report.delegated_ops
    assert report.delegated_ops.get("aten.addmm.default") or report.delegated_ops.get("aten.mm.default"), report.delegated_ops
