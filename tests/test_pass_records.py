"""A pass returns its program and its records (``edgeplug.plugin.PassResult``); the runner and the
report keep every one, in order, with no state beside the return value."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import edgeplug
from edgeplug import PassError
from edgeplug._graph import run_passes
from edgeplug._graph.passes import core_pass
from edgeplug.plugin import NodeBuilder, PassResult, PassSpec, TransformRecord, calls_to, note_rewrite, rewrite_pass


class Scaled(nn.Module):
    def forward(self, x):
        return torch.relu(torch.ops.aten.mul.Scalar(x, 2.0)) + x.clone()


def _edge():
    from executorch.exir import to_edge

    return to_edge(torch.export.export(Scaled(), (torch.randn(2, 3),))).exported_program()


def relu_as_clamp(ep):
    build = NodeBuilder(ep)
    records = []
    for node in calls_to(ep, ["aten.relu.default"]):
        records.append(note_rewrite("relu_as_clamp", node, 1, "relu as clamp(min=0)"))
        build.replace(node, build.call(node, "clamp", (node.args[0], 0.0)))
    return PassResult(ep, records)


def test_the_runner_returns_every_passs_records_in_order():
    ep = _edge()
    x = torch.randn(2, 3)
    expected = ep.module()(x)
    passes = [
        core_pass("nothing", lambda ep: None),
        rewrite_pass("scalar_to_tensor", backend="any"),
        core_pass("relu_as_clamp", relu_as_clamp),
        rewrite_pass("drop_identity_copies", backend="any"),
    ]
    done = run_passes(ep, passes)
    assert [(r.transform, r.op) for r in done.records] == [
        ("scalar_to_tensor", "aten.mul.Scalar"),
        ("relu_as_clamp", "aten.relu.default"),
        ("drop_identity_copies", "dim_order_ops._clone_dim_order.default"),
    ]
    assert isinstance(done.records, tuple) and all(isinstance(r, TransformRecord) for r in done.records)
    assert torch.equal(done.program.module()(x), expected)


def test_a_record_made_but_not_returned_is_not_reported():
    # nothing is collected on the side: note_rewrite only makes the record
    def forgetful(ep):
        for node in calls_to(ep, ["aten.relu.default"]):
            note_rewrite("forgetful", node, 0, "made, then dropped")

    assert run_passes(_edge(), [core_pass("forgetful", forgetful)]).records == ()


@pytest.mark.parametrize(
    "result, says",
    [
        (lambda ep: PassResult(ep, ["not a record"]), "a str among its records"),
        (lambda ep: PassResult(ep.graph_module, ()), "a GraphModule as its program"),
        (lambda ep: [note_rewrite("x", next(iter(calls_to(ep, ["aten.relu.default"]))), 0, "")], "returned list"),
    ],
    ids=["bad-record", "bad-program", "bare-list"],
)
def test_a_pass_returning_something_else_is_named(result, says):
    with pytest.raises(PassError, match=rf"'odd' .*returned the wrong type.*{says}") as info:
        run_passes(_edge(), [core_pass("ok", lambda ep: None), core_pass("odd", result)])
    assert info.value.passes_before == ("ok",)


def test_a_plugin_passs_records_reach_the_report(fixture_backends, edgeplug_register):
    class ReluAsClamp:
        @edgeplug.hookimpl
        def edgeplug_passes(self):
            yield PassSpec(backend=fixture_backends.TABLE, stage="pre_partition", name="relu_as_clamp", fn=relu_as_clamp)

    edgeplug_register(ReluAsClamp(), name="relu-as-clamp")
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    report = edgeplug.lower(model, (torch.randn(2, 3),), fixture_backends.TABLE, dry_run=True).report
    [record] = [t for t in report.transforms if t.transform == "relu_as_clamp"]
    assert (record.kind, record.outcome, record.op, record.added) == ("rewrite", "applied", "aten.relu.default", 1)
