"""The xnnpack backend, the template third-party plugin: the conformance suite, and running its .pte."""

from __future__ import annotations

import re
from importlib.metadata import distribution

import edgeplug
from edgeplug.testing.conformance import *  # noqa: F401,F403

EDGEPLUG_BACKENDS = ["xnnpack"]


def test_a_third_party_plugin_needs_one_module_and_one_entry_point():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    xnnpack = edgeplug.get_backend("xnnpack")
    assert type(xnnpack.make_partitioner()) is XnnpackPartitioner
    assert (xnnpack.spec.backend_id, xnnpack.spec.verify_method) == ("XnnpackBackend", "pte")
    dist = distribution("edgeplug-xnnpack")
    # the core and the ExecuTorch releases the plugin is tested with, nothing else
    assert [re.split(r"[<>=!~ ]", r)[0] for r in dist.requires] == ["edgeplug", "executorch"]
    assert [(e.name, e.value) for e in dist.entry_points if e.group == "edgeplug"] == [("xnnpack", "edgeplug_xnnpack.hooks")]


def test_runs_its_pte_in_executorchs_runtime(edgeplug_lowering):
    report = edgeplug_lowering("mlp", "xnnpack", verify=True).report
    assert report.verification.method == "pte"
    assert report.verification.adapter == "executorch runtime (host CPU)"
    assert report.verification.max_abs_diff < 1e-4


# -- the example's own filter and pass ------------------------------------------------


class _Float64Sum(__import__("torch").nn.Module):
    def forward(self, x):
        return (x.double() * 2).sum(-1)


def test_the_filter_refuses_float64_with_its_own_reason():
    import torch

    report = edgeplug.lower(_Float64Sum(), (torch.randn(2, 8),), "xnnpack", dry_run=True).report
    reasons = {c.op: c.reason for c in report.cpu_nodes}
    assert reasons["aten.sum.dim_IntList"] == (
        "refused by filter 'xnnpack-no-float64': XNNPACK computes in float32 or lower; "
        "this node's output is float64, so it stays on the CPU"
    )
    assert "aten.sum.dim_IntList" not in report.delegated_ops


def test_a_float64_model_says_nothing_was_delegated_and_why_in_float64_terms():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 4)).double().eval()
    report = edgeplug.lower(model, (torch.randn(2, 8, dtype=torch.float64),), "xnnpack", verify=True).report
    assert report.partitions == [] and report.cpu_nodes and report.verification.passed
    # XNNPACK's partitioner refuses these with "invalid dtype"; the plugin's filter says which dtype and why
    for c in report.cpu_nodes:
        if c.op in ("aten.addmm.default", "aten.gelu.default"):
            assert "float64" in c.reason, (c.op, c.reason)
    assert any(n.startswith("nothing was delegated to backend 'xnnpack'") for n in report.notes), report.notes
    assert "note: nothing was delegated" in report.to_table()


def test_the_filter_has_no_opinion_on_float32_nodes():
    import torch

    from edgeplug_xnnpack.filters import no_float64

    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    node.meta["val"] = torch.empty(2, 3)
    assert no_float64(node, None) is None
    node.meta["val"] = torch.empty(2, 3, dtype=torch.float64)
    assert not no_float64(node, None)


class _Divides(__import__("torch").nn.Module):
    def forward(self, x):
        return x / 4.0, x / 3.0, x / 0.5


def test_the_pass_turns_division_by_a_power_of_two_into_an_exact_multiply():
    import torch

    x = torch.randn(3, 5) * 1e3
    ep = torch.export.export(_Divides(), (x,))
    out = edgeplug.transform(ep, "xnnpack")
    calls = [(str(n.target), n.args[1]) for n in out.graph.nodes if n.op == "call_function"]
    assert calls == [("aten.mul.Tensor", 0.25), ("aten.div.Tensor", 3.0), ("aten.mul.Tensor", 2.0)]
    for got, want in zip(out.module()(x), _Divides()(x)):
        assert torch.equal(got, want)  # bitwise: the rewrite is exact
    xnnpack = edgeplug.get_backend("xnnpack")
    assert [p.name for p in xnnpack.passes_for("export")] == ["div_by_power_of_two_to_mul"]
    assert xnnpack.origin(xnnpack.passes[0]).distribution == "edgeplug-xnnpack"
