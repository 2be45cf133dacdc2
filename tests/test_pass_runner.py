"""The pass runner: order, name reservation, lint of every graph module, errors that name the pass."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import edgeplug
from edgeplug import PassSpec
from edgeplug._errors import PassError
from edgeplug._graph import run_passes
from edgeplug._graph.passes import core_pass

#: the fixture backends (tests/fixtures/backends): one with an export pass of its own, one fusing aten.rms_norm
TABLE, KEEP = "fixture-table", "fixture-keep"


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2


class Branches(nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: (t + 1).sin(), lambda t: t - 1, (x,))


def _export(model=None):
    return torch.export.export(model or Small(), (torch.randn(2, 4),))


# passes the tests plug in -------------------------------------------------------


def rename_duplicate(ep):
    """Corrupts the top-level graph: two nodes named alike."""
    nodes = [n for n in ep.graph.nodes if n.op == "call_function"]
    nodes[1].name = nodes[0].name


def corrupt_branch(ep):
    """Corrupts a nested graph module (a cond branch)."""
    branch = next(m for name, m in ep.graph_module.named_children() if isinstance(m, torch.fx.GraphModule))
    nodes = [n for n in branch.graph.nodes if n.op == "call_function"]
    nodes[-1].name = nodes[0].name


def add_stray_input(ep):
    """Adds a placeholder without telling the graph signature."""
    first = next(iter(ep.graph.nodes))
    with ep.graph.inserting_before(first):
        ep.graph.placeholder("stray")


def double_output(ep):
    """Appends ``* 3`` to the output, in place (a well-behaved pass)."""
    out = next(n for n in ep.graph.nodes if n.op == "output")
    (value,) = out.args[0]
    with ep.graph.inserting_before(out):
        mul = ep.graph.call_function(torch.ops.aten.mul.Tensor, (value, 3))
    mul.meta["val"] = value.meta["val"]
    out.args = ((mul,),)


def explode(ep):
    raise KeyError("arg0_1")


class CorruptingPlugin:
    """A third-party plugin that adds passes to an existing backend (fixture-table, which has its own)."""

    @edgeplug.hookimpl
    def edgeplug_passes(self):
        yield PassSpec(backend=TABLE, stage="export", name="triple", fn=double_output, order=30)
        yield PassSpec(backend=TABLE, stage="export", name="rename_duplicate", fn=rename_duplicate, order=40)


@pytest.fixture
def corrupting_plugin(fixture_backends):
    from edgeplug._registry import lookup as plugins

    plugins.register(CorruptingPlugin(), name="corrupting")
    yield
    plugins.unregister("corrupting")


# tests ------------------------------------------------------------------------


def test_passes_run_in_order_and_may_return_a_new_program():
    seen = []

    def record(tag):
        def fn(ep):
            seen.append(tag)
        return fn

    replacement = _export()

    passes = [core_pass("a", record("a")), core_pass("new", lambda ep: replacement), core_pass("b", record("b"))]
    assert run_passes(_export(), passes).program is replacement
    assert seen == ["a", "b"]


def test_a_plugin_pass_that_corrupts_the_graph_is_named(corrupting_plugin):
    ep = _export()
    model_in = torch.randn(2, 4)
    with pytest.raises(PassError) as info:
        edgeplug.transform(ep, TABLE)
    err = info.value
    message = str(err)
    assert "'rename_duplicate'" in message and "plugin 'corrupting'" in message
    assert f"backend '{TABLE}'" in message and "export-stage" in message
    assert "Passes run before it in this stage: 'div_by_two_as_mul', 'triple'" in message
    assert "redefined name" in message  # the cause
    assert err.pass_name == "rename_duplicate" and err.plugin.name == "corrupting"
    assert err.passes_before == ("div_by_two_as_mul", "triple")
    assert isinstance(err.__cause__, Exception) and "redefined name" in str(err.__cause__)
    del model_in


def test_transform_runs_the_backends_export_passes(corrupting_plugin):
    # with only the well-behaved extra pass, transform applies it through the runner
    from edgeplug._registry import lookup as plugins

    plugins.unregister("corrupting")

    class OnlyTriple:
        @edgeplug.hookimpl
        def edgeplug_passes(self):
            yield PassSpec(backend=TABLE, stage="export", name="triple", fn=double_output, order=30)

    plugins.register(OnlyTriple(), name="only-triple")
    try:
        model = Small().eval()
        x = torch.randn(2, 4)
        ep = edgeplug.transform(torch.export.export(model, (x,)), TABLE)
        torch.testing.assert_close(ep.module()(x), model(x) * 3)
        # the pass did not recompile; the runner did, so the module's code is current
        assert "mul_tensor" in ep.graph_module.code
    finally:
        plugins.unregister("only-triple")


def test_a_corrupted_nested_graph_is_caught():
    ep = torch.export.export(Branches(), (torch.randn(3),))
    with pytest.raises(PassError, match=r"nested graph module 'true_graph_0'.*redefined name") as info:
        run_passes(ep, [core_pass("ok", lambda ep: None), core_pass("corrupt_branch", corrupt_branch)])
    assert "Passes run before it in this stage: 'ok'" in str(info.value)


def test_a_signature_mismatch_is_caught():
    with pytest.raises(PassError, match=r"'add_stray_input'.*placeholders .*stray.* do not match the graph signature"):
        run_passes(_export(), [core_pass("add_stray_input", add_stray_input, stage="export")])


def test_a_raising_pass_keeps_its_cause():
    with pytest.raises(PassError, match=r"'explode'.*raised: KeyError: 'arg0_1'.*Passes run before it in this stage: none") as info:
        run_passes(_export(), [core_pass("explode", explode)])
    assert isinstance(info.value.__cause__, KeyError)


def test_a_pass_returning_the_wrong_type_is_named():
    with pytest.raises(PassError, match=r"'bad_return' .*returned the wrong type.*GraphModule"):
        run_passes(_export(), [core_pass("bad_return", lambda ep: ep.graph_module)])


def test_names_are_reserved_before_each_pass():
    # the second pass gets a program the first one returned fresh from export,
    # whose names torch.export did not record; the runner reserves them again
    class Named(nn.Module):
        def forward(self, mul):
            return mul * 2

    x = torch.randn(3)
    fresh = torch.export.export(Named(), (x,))

    def add_mul(ep):
        out = next(n for n in ep.graph.nodes if n.op == "output")
        (value,) = out.args[0]
        with ep.graph.inserting_before(out):
            # a pass asking for the name "mul", as node_copy of a traced mul does
            new = ep.graph.create_node("call_function", torch.ops.aten.mul.Tensor, (value, 1), name="mul")
        new.meta["val"] = value.meta["val"]
        out.args = ((new,),)

    ep = run_passes(_export(), [core_pass("swap", lambda ep: fresh), core_pass("add_mul", add_mul)]).program
    names = [n.name for n in ep.graph.nodes]
    assert len(names) == len(set(names))
    torch.testing.assert_close(ep.module()(x), x * 2)


def test_the_cores_fusion_runs_through_the_runner(monkeypatch, fixture_backends):
    # a fusion that corrupts the graph is reported as the core's pass (an aten.rms_norm target: export stage)
    import importlib

    pipeline = importlib.import_module("edgeplug._pipeline")

    def corrupting_fuse(ep, backend, delegation):
        rename_duplicate(ep)
        return ep, []

    monkeypatch.setattr(pipeline, "fuse_for_backend", corrupting_fuse)
    with pytest.raises(PassError) as info:  # a program with a norm: the fusion runs only where one is
        edgeplug.lower(_Norm(), (torch.randn(2, 8),), KEEP, dry_run=True)
    message = str(info.value)
    assert f"export-stage pass 'fuse' of the edgeplug core (lowering for backend '{KEEP}')" in message
    assert "redefined name" in message


def test_a_program_without_a_norm_skips_the_fusion(monkeypatch, fixture_backends):
    # the fusion copies and revalidates the whole program: where no norm is, it is not run, and nothing is recorded
    import importlib

    pipeline = importlib.import_module("edgeplug._pipeline")

    def no_fusion_here(ep, backend, delegation):
        raise AssertionError("the fusion ran on a program without a norm")

    monkeypatch.setattr(pipeline, "fuse_for_backend", no_fusion_here)
    result = edgeplug.lower(Small(), (torch.randn(2, 4),), KEEP, dry_run=True)
    assert result.report.fusions == []
    with pytest.raises(PassError, match="the fusion ran"):  # a norm: it runs
        edgeplug.lower(_Norm(), (torch.randn(2, 8),), KEEP, dry_run=True)


class _Norm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


@pytest.mark.parametrize("backend, edge_sees_it_fused", [("fixture-fused", False), (KEEP, True)])
def test_edge_passes_see_the_norm_and_pre_partition_passes_see_it_fused(backend, edge_sees_it_fused, fixture_backends):
    """Stage "edge" runs before an edge-stage fusion (a backend's own op), "pre_partition" after
    it; an aten-namespace target (aten.rms_norm) is fused on the aten program, before both."""
    from edgeplug._registry import lookup as plugins

    seen: dict[str, set] = {}

    def look(stage):
        def fn(ep):
            seen[stage] = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
        return fn

    class Observer:
        @edgeplug.hookimpl
        def edgeplug_passes(self):
            yield PassSpec(backend=backend, stage="edge", name="look-edge", fn=look("edge"))
            yield PassSpec(backend=backend, stage="pre_partition", name="look-late", fn=look("pre_partition"))

    plugins.register(Observer(), name="observer")
    try:
        result = edgeplug.lower(_Norm(), (torch.randn(2, 8),), backend, dry_run=True)
    finally:
        plugins.unregister("observer")
    [fusion] = result.report.fusions
    assert fusion.outcome == "fused"
    if edge_sees_it_fused:
        assert any("rms_norm" in t for t in seen["edge"]) and not any("rsqrt" in t for t in seen["edge"])
    else:
        assert any("rsqrt" in t for t in seen["edge"]) and not any("rms_norm" in t for t in seen["edge"])
    assert any("rms_norm" in t for t in seen["pre_partition"]) and not any("rsqrt" in t for t in seen["pre_partition"])


def test_a_constraint_across_stages_is_refused(fixture_backends):
    from edgeplug._registry import lookup as plugins

    class Crossing:
        @edgeplug.hookimpl
        def edgeplug_passes(self):
            yield PassSpec(backend=TABLE, stage="edge", name="early-x", fn=lambda ep: None)
            yield PassSpec(backend=TABLE, stage="pre_partition", name="late-x", fn=lambda ep: None, after="early-x")

    plugins.register(Crossing(), name="crossing")
    try:
        with pytest.raises(Exception, match="constraints order passes of one stage"):
            edgeplug.get_backend(TABLE).passes_for("pre_partition")
    finally:
        plugins.unregister("crossing")


class _LargeTable(nn.Module):
    """A byte table past 2**24 elements, where float32 sample positions round past the last element."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.zeros(2**24 + 4, dtype=torch.uint8))

    def forward(self, i):
        return self.table[i]


def test_the_write_check_samples_a_weight_past_two_to_the_24_elements_up_to_its_last():
    def write_last(ep):
        ep.state_dict["table"].data[-1] = 7  # through .data: no version counter sees it

    i = torch.tensor([0, 3])
    assert run_passes(torch.export.export(_LargeTable(), (i,)), [core_pass("nothing", lambda ep: None)]).program
    with pytest.raises(PassError, match=r"'write_last'.*changed the weight 'table' in place"):
        run_passes(torch.export.export(_LargeTable(), (i,)), [core_pass("write_last", write_last)])
