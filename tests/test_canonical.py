"""The core's canonicalizing rewrites (edgeplug._graph.canonical), on real exported programs.

Per rewrite: the graph after it (what is gone, what took its place),
bitwise-equal outputs before and after in fp32 and bf16, records that match
the graph, and what it must leave alone (symbolic dims, ranks and dims it does
not handle, dtypes it was not asked for, non-contiguous tensors, scalars a
dtype cannot hold). Then the declarations: a third party's backend choosing
rewrites through the passes hook, the order of rewrites and fusions, and a
plugin's own rewrite, all on the fixture backends (tests/fixtures/backends).
Whether one backend's partitioner takes what a rewrite leaves is that
plugin's test (plugins/<backend>/tests).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

import edgeplug
from edgeplug._graph.ops import op_name
from edgeplug.plugin import FLOATS, apply_rewrite, rewrite_pass
from edgeplug.testing.rewrites import RewriteBlock, RewritePieces, block_inputs, edge_program, op_counts, rewritten

DTYPES = [torch.float32, torch.bfloat16]
#: each rewrite with the parameters it is tested under (every dtype: exactness is checked in bf16 too)
REWRITES = {
    "scalar_to_tensor": {"dtypes": None},
    "mean_at_rank": {"rank": 4, "dims": (2, 3), "dtypes": None},
    "unsqueeze_as_view": {"except_trailing": True},
    "squeeze_as_view": {},
    "expand_as_cat": {"distinct_inputs": True, "dtypes": None},
    "drop_identity_copies": {},
    "any_as_amax": {},
    "split_as_slices": {"dtypes": None},
    "select_as_slice": {"dtypes": None},
}


@pytest.fixture(scope="session")
def block_edge():
    """dtype -> (the RewriteBlock's edge program, its inputs)."""
    return {d: (edge_program(RewriteBlock().to(d), block_inputs(d)), block_inputs(d)) for d in DTYPES}


@pytest.fixture(scope="session")
def pieces_edge():
    """dtype -> (the RewritePieces module's edge program, its inputs)."""
    return {d: (edge_program(RewritePieces(), block_inputs(d)), block_inputs(d)) for d in DTYPES}


@pytest.fixture(scope="session")
def decoder(zoo):
    """dtype -> (edgeplug._zoo's one-layer transformers Llama as an edge program, its inputs)."""
    pytest.importorskip("transformers")
    from executorch.exir import EdgeCompileConfig, to_edge

    out = {}
    for dtype in DTYPES:
        model, inputs = zoo.build("llama", 1)
        with torch.no_grad():
            ep = torch.export.export(model.to(dtype), inputs)
        out[dtype] = (to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program(), inputs)
    return out


def _run(ep, inputs) -> torch.Tensor:
    with torch.no_grad():
        return ep.module()(*inputs)


def _node_count(ep) -> int:
    return sum(1 for n in ep.graph_module.graph.nodes if n.op in ("call_function", "placeholder"))


# -- every rewrite: exact, recorded as it changed the graph ----------------------------------


#: the programs holding each rewrite's op
PROGRAMS = {
    "scalar_to_tensor": ("block", "decoder"),
    "mean_at_rank": ("block", "decoder"),
    "unsqueeze_as_view": ("block", "decoder"),
    "squeeze_as_view": ("block",),
    "expand_as_cat": ("block", "decoder"),
    "drop_identity_copies": ("decoder", "pieces"),
    "any_as_amax": ("decoder",),
    "split_as_slices": ("pieces",),
    "select_as_slice": ("pieces",),
}
CASES = [(name, program) for name, programs in PROGRAMS.items() for program in programs]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("name, program", CASES)
def test_rewrite_is_bitwise_exact_and_its_records_match_the_graph(name, program, dtype, block_edge, decoder, pieces_edge):
    ep, inputs = {"block": block_edge, "decoder": decoder, "pieces": pieces_edge}[program][dtype]
    after, records = rewritten(ep, name, **REWRITES[name])
    assert records, f"{name} changed nothing in the {program}"
    assert torch.equal(_run(after, inputs), _run(ep, inputs))
    names = {n.name for n in after.graph_module.graph.nodes}
    before_ops = {n.name: op_name(n) for n in ep.graph_module.graph.nodes}
    for r in records:
        assert (r.transform, r.kind) == (name, "rewrite")
        assert r.node not in names and before_ops[r.node] == r.op
    assert _node_count(after) - _node_count(ep) == sum(r.added - r.removed for r in records)


# -- what each leaves in the graph, and that the backend takes it -----------------------------


def _calls(ep, name: str) -> list:
    return [n for n in ep.graph_module.graph.nodes if n.op == "call_function" and op_name(n) == name]


def test_scalar_ops_become_tensor_ops_on_a_0d_constant_of_the_input_dtype(block_edge, decoder):
    for ep, _ in (block_edge[torch.float32], decoder[torch.float32]):
        assert op_counts(ep)["aten.mul.Scalar"]
        after, records = rewritten(ep, "scalar_to_tensor")
        ops = op_counts(after)
        assert not any(op.endswith(".Scalar") and op.split(".")[1] in ("mul", "add", "sub", "div") for op in ops)
        constants = {s.arg.name: after.constants[s.target] for s in after.graph_signature.input_specs if s.target in after.constants}
        for r in records:
            value = float(r.detail.split("constant ")[1].split(" ")[0])
            users = [n for n in after.graph_module.graph.nodes if n.op == "call_function"
                     and any(a.name in constants and constants[a.name].ndim == 0 and constants[a.name].item() == value
                             for a in n.all_input_nodes)]
            assert users and all(op_name(n) == r.op.replace(".Scalar", ".Tensor") for n in users)
    # one constant per value and dtype: the decoder's two 0.5 scalings share theirs
    _, records = rewritten(decoder[torch.float32][0], "scalar_to_tensor")
    assert [r.added for r in records] == [2, 1] and records[0].bytes_added == 4


def test_mean_is_raised_to_rank_4_over_the_innermost_dims(decoder):
    ep, _ = decoder[torch.float32]
    means = _calls(ep, "aten.mean.dim")
    assert means and all(n.args[0].meta["val"].ndim == 3 for n in means)
    after, records = rewritten(ep, "mean_at_rank", rank=4, dims=(2, 3))
    assert len(records) == len(means) == len(_calls(after, "aten.mean.dim"))
    for node in _calls(after, "aten.mean.dim"):
        assert node.args[0].meta["val"].shape == (1, 8, 64, 1) and list(node.args[1]) == [2, 3] and node.args[2]
        (back,) = node.users
        assert op_name(back) == "aten.view_copy.default" and back.meta["val"].shape == (1, 8, 1)


@pytest.mark.parametrize(
    "shape, dims, keepdim, view",
    [
        ((5, 7), [-1], False, [1, 5, 7, 1]),  # pads the kept dims in front, the reduced behind
        ((2, 3, 4, 5, 6), [-2, -1], True, [6, 4, 5, 6]),  # merges the leading kept dims
        ((2, 3, 4, 5), [1, 2, 3], True, [1, 2, 12, 5]),  # merges the leading reduced dims
    ],
)
def test_mean_at_rank_fits_other_ranks_into_the_backend_rank(shape, dims, keepdim, view):
    class Mean(nn.Module):
        def forward(self, x):
            return x.mean(dims, keepdim=keepdim) * 2

    for dtype in DTYPES:
        inputs = (torch.randn(shape).to(dtype),)
        ep = edge_program(Mean(), inputs)
        after, records = rewritten(ep, "mean_at_rank", dtypes=None)
        assert len(records) == 1 and torch.equal(_run(after, inputs), _run(ep, inputs))
        (mean,) = _calls(after, "aten.mean.dim")
        assert list(mean.args[0].meta["val"].shape) == view


def test_unsqueeze_and_squeeze_become_views(block_edge):
    ep, _ = block_edge[torch.float32]
    (unsqueeze,) = _calls(ep, "aten.unsqueeze_copy.default")
    assert unsqueeze.args[1] != unsqueeze.meta["val"].ndim - 1  # not on the trailing dim
    after, records = rewritten(ep, "unsqueeze_as_view")
    assert not _calls(after, "aten.unsqueeze_copy.default") and "[1, 2, 8, 16] -> [1, 2, 1, 8, 16]" in records[0].detail
    after, _ = rewritten(after, "squeeze_as_view")
    assert not [op for op in op_counts(after) if op.startswith("aten.squeeze_copy")]


def test_unsqueeze_of_the_trailing_dim_is_left_when_asked():
    class Trailing(nn.Module):
        def forward(self, x):
            return x.unsqueeze(-1).unsqueeze(0) + 1

    ep = edge_program(Trailing(), (torch.randn(3, 4),))
    after, records = rewritten(ep, "unsqueeze_as_view", except_trailing=True)
    assert [r.detail for r in records] == ["view_copy [3, 4, 1] -> [1, 3, 4, 1]"]
    (kept,) = _calls(after, "aten.unsqueeze_copy.default")
    assert kept.meta["val"].shape == (3, 4, 1)


def test_key_value_heads_repeat_as_a_cat_of_distinct_inputs(block_edge, decoder):
    for ep, _ in (block_edge[torch.float32], decoder[torch.float32]):
        after, records = rewritten(ep, "expand_as_cat", distinct_inputs=True)
        # the decoder's mask and positions (bool, int64) are constant folding's
        assert all(not n.meta["val"].is_floating_point() for n in _calls(after, "aten.expand_copy.default"))
        cats = [n for n in _calls(after, "aten.cat.default") if n.name not in {c.name for c in _calls(ep, "aten.cat.default")}]
        assert cats and all(len(set(c.args[0])) >= 2 for c in cats)
    # without distinct inputs the cat repeats one node
    after, _ = rewritten(block_edge[torch.float32][0], "expand_as_cat")
    (cat,) = _calls(after, "aten.cat.default")
    assert len(set(cat.args[0])) == 1 and len(cat.args[0]) == 3


@pytest.mark.parametrize("copies, max_inputs", [(3, None), (7, 2), (12, 5), (5, 5)])
def test_expand_as_cat_keeps_each_cat_within_its_input_limit(copies, max_inputs):
    class Expand(nn.Module):
        def forward(self, x):
            return x.expand(2, copies, 3, 4) + 1

    for dtype in DTYPES:
        inputs = (torch.randn(3, 1, 1, 4).to(dtype)[:1],)
        ep = edge_program(Expand(), inputs)
        after, records = rewritten(ep, "expand_as_cat", max_inputs=max_inputs, distinct_inputs=True, dtypes=None)
        assert len(records) == 1 and torch.equal(_run(after, inputs), _run(ep, inputs))
        cats = _calls(after, "aten.cat.default")
        assert cats and all(2 <= len(set(c.args[0])) and (max_inputs is None or len(c.args[0]) <= max_inputs) for c in cats)


def test_splits_and_selects_become_slices(pieces_edge):
    ep, _ = pieces_edge[torch.float32]
    after, _ = rewritten(ep, "split_as_slices")
    after, _ = rewritten(after, "select_as_slice")
    after, records = rewritten(after, "drop_identity_copies")
    ops = op_counts(after)
    assert not ops["aten.split_with_sizes_copy.default"] and not ops["aten.select_copy.int"] and not ops["getitem"]
    assert not ops["aten.cat.default"] and [r.op for r in records] == ["aten.cat.default"]  # the cat of one
    slices = _calls(after, "aten.slice_copy.Tensor")
    assert len(slices) == 3 + 3 + 2  # and the two it had
    bounds = sorted((n.args[2], n.args[3]) for n in slices if n.args[1] == 2 and n.args[0].op == "placeholder")
    assert bounds == [(0, 8), (8, 24), (24, 32)]


def test_identity_copies_are_dropped(decoder):
    ep, _ = decoder[torch.float32]
    assert op_counts(ep)["aten.alias_copy.default"]
    after, records = rewritten(ep, "drop_identity_copies")
    assert not op_counts(after)["aten.alias_copy.default"]
    assert {r.op for r in records} >= {"aten.alias_copy.default", "aten.expand_copy.default"}


def test_any_becomes_a_float_max(decoder):
    ep, _ = decoder[torch.float32]
    (any_node,) = _calls(ep, "aten.any.dim")
    after, records = rewritten(ep, "any_as_amax")
    assert not _calls(after, "aten.any.dim") and records[0].bytes_added == 8
    new = [n for n in after.graph_module.graph.nodes if n.op == "call_function" and n.name not in {m.name for m in ep.graph_module.graph.nodes}]
    assert sorted(op_name(n) for n in new) == ["aten.amax.default", "aten.ne.Scalar", "aten.where.self"]


def test_any_over_a_middle_dim_without_keepdim():
    class Any(nn.Module):
        def forward(self, x):
            return x.gt(0.5).any(1), (x > 2).any(-1)  # the second is all False

    inputs = (torch.rand(2, 5, 3),)
    ep = edge_program(Any(), inputs)
    after, records = rewritten(ep, "any_as_amax")
    assert len(records) == 2 and "viewed as [2, 3]" in records[0].detail
    assert all(torch.equal(a, b) for a, b in zip(_run(after, inputs), _run(ep, inputs)))
    (amax, _) = _calls(after, "aten.amax.default")
    assert amax.args[2] is True  # reduced with keepdim, then viewed


# -- what each must leave alone ----------------------------------------------------------------


def _untouched(ep, name: str, **params) -> None:
    after, records = rewritten(ep, name, **params)
    assert records == []
    assert op_counts(after) == op_counts(ep)


@pytest.fixture(scope="session")
def dynamic_block():
    """The RewriteBlock exported with a symbolic sequence length."""
    seq = torch.export.Dim("seq", min=2, max=64)
    return edge_program(RewriteBlock(), block_inputs(), dynamic_shapes={"x": {1: seq}})


def test_symbolic_dims_are_left_alone_where_a_size_decides_the_result(dynamic_block):
    _untouched(dynamic_block, "expand_as_cat")  # how many copies is fixed, but the block's expand reads s


@pytest.mark.parametrize("name", ["mean_at_rank", "unsqueeze_as_view", "squeeze_as_view"])
def test_one_symbolic_size_is_written_minus_one_and_holds_for_any_length(name, dynamic_block):
    after, records = rewritten(dynamic_block, name)
    assert records and op_counts(after) != op_counts(dynamic_block)
    before = {n.name for n in _calls(dynamic_block, "aten.view_copy.default")}
    made = [n for n in _calls(after, "aten.view_copy.default") if n.name not in before]
    assert made and all(all(type(d) is int for d in n.args[1]) and list(n.args[1]).count(-1) == 1 for n in made)
    for length in (2, 13, 64):
        inputs = (torch.randn(1, length, 32),)
        assert torch.equal(_run(after, inputs), _run(dynamic_block, inputs))


def test_symbolic_view_sizes_writes_the_views_sym_size_as_minus_one(dynamic_block):
    (view,) = [n for n in _calls(dynamic_block, "aten.view_copy.default") if not all(type(d) is int for d in n.args[1])][:1]
    after, records = rewritten(dynamic_block, "symbolic_view_sizes")
    assert view.name in [r.node for r in records]
    assert all(all(type(d) is int for d in n.args[1]) for n in _calls(after, "aten.view_copy.default"))
    for length in (2, 13):
        inputs = (torch.randn(1, length, 32),)
        assert torch.equal(_run(after, inputs), _run(dynamic_block, inputs))
    _untouched(after, "symbolic_view_sizes")  # nothing left to write


def test_any_of_a_symbolic_or_non_bool_tensor_is_left_alone():
    class Any(nn.Module):
        def forward(self, x):
            return x.gt(0).any(-1), torch.ops.aten.any.dim(x, 0)

    ep = edge_program(Any(), (torch.randn(3, 4),), dynamic_shapes={"x": {0: torch.export.Dim("n", min=2, max=9)}})
    _untouched(ep, "any_as_amax")
    _, records = rewritten(edge_program(Any(), (torch.randn(3, 4),)), "any_as_amax")
    assert [r.node for r in records] == ["aten_any_dim"]  # the bool one; any of floats stays


def test_scalar_to_tensor_holds_for_any_sequence_length(dynamic_block):
    inputs = (torch.randn(1, 13, 32),)
    after, records = rewritten(dynamic_block, "scalar_to_tensor")
    assert records and torch.equal(_run(after, inputs), _run(dynamic_block, inputs))


@pytest.mark.parametrize("name", ["scalar_to_tensor", "mean_at_rank", "expand_as_cat"])
def test_dtypes_the_backend_lacks_are_left_alone(name, block_edge):
    _untouched(block_edge[torch.bfloat16][0], name, dtypes=FLOATS)


def test_scalars_a_dtype_cannot_hold_are_left_alone(block_edge):
    class Scaled(nn.Module):
        def forward(self, x):
            return torch.ops.aten.mul.Scalar(x, 0.1) + torch.ops.aten.add.Scalar(x, 3, 2)

    inputs = (torch.randn(4, 4).to(torch.bfloat16),)
    _untouched(edge_program(Scaled(), inputs), "scalar_to_tensor")  # 0.1 is no bf16 number; alpha 2
    inputs = (torch.randn(4, 4),)
    ep = edge_program(Scaled(), inputs)
    after, records = rewritten(ep, "scalar_to_tensor")  # fp32 holds 0.1 as eager does; alpha 2 stays
    assert [r.op for r in records] == ["aten.mul.Scalar"] and op_counts(after)["aten.add.Scalar"] == 1
    assert torch.equal(_run(after, inputs), _run(ep, inputs))


def test_means_the_rewrite_cannot_map_are_left_alone():
    class Means(nn.Module):
        def forward(self, x, y):
            # not the trailing dims; already 4-d over (2, 3) with keepdim; an explicit dtype
            return x.mean(1, keepdim=True), y.mean((2, 3), keepdim=True), x.mean(-1, dtype=torch.float32)

    _untouched(edge_program(Means(), (torch.randn(2, 3, 4), torch.randn(1, 2, 3, 4))), "mean_at_rank")


def test_non_contiguous_tensors_are_left_alone():
    class Unsqueeze(nn.Module):
        def forward(self, x):
            return x.unsqueeze(1), x.expand(2, 3, 4, 5).mean((2, 3), keepdim=False)

    x = torch.randn(1, 3, 4, 5).to(memory_format=torch.channels_last)
    ep = edge_program(Unsqueeze(), (x,))
    assert not ep.graph_module.graph.find_nodes(op="placeholder")[0].meta["val"].is_contiguous()
    for name in ("unsqueeze_as_view", "expand_as_cat"):
        _untouched(ep, name)


def test_a_copy_that_is_a_program_output_stays():
    class Outputs(nn.Module):
        def forward(self, x):
            y = x * 2
            return torch.ops.aten.alias(y), y.expand(3, 4)

    ep = edge_program(Outputs(), (torch.randn(3, 4),))
    assert {"aten.alias_copy.default", "aten.expand_copy.default"} <= set(op_counts(ep))
    for name in ("drop_identity_copies", "expand_as_cat"):
        _untouched(ep, name)


def test_declaring_an_unknown_rewrite_or_parameter_fails_at_once():
    with pytest.raises(ValueError, match="no canonicalizing rewrite 'mean_to_rank'.*mean_at_rank"):
        rewrite_pass("mean_to_rank", backend="x")
    with pytest.raises(TypeError, match="rewrite 'mean_at_rank' takes \\['rank', 'dims', 'dtypes'\\]"):
        rewrite_pass("mean_at_rank", backend="x", ranks=4)
    with pytest.raises(ValueError, match="trailing dims of rank 4"):
        apply_rewrite(torch.export.export(nn.Identity(), (torch.randn(1),)), "mean_at_rank", dims=(1, 2))


# -- declared by plugins -------------------------------------------------------------------------


#: what a plain table backend takes: the forms the rewrites leave, none of the forms they replace
_PLAIN_OPS = (
    "add.Tensor", "sub.Tensor", "mul.Tensor", "rsqrt.default", "pow.Tensor_Scalar", "mean.dim", "view_copy.default",
    "permute_copy.default", "cat.default",
)


class PlainTable:
    """A third party's backend over a support table, with no passes of its own."""

    def __init__(self, fb) -> None:
        self.fb = fb

    def partitioner(self):
        from edgeplug.plugin import SupportTablePartitioner

        self.fb.table_partitioner()  # registers the fixture backend id's preprocess
        ops = [getattr(getattr(torch.ops.aten, op), overload) for op, overload in (n.split(".") for n in _PLAIN_OPS)]
        ops.append(torch.ops.dim_order_ops._clone_dim_order.default)  # the copy a reshape of a transpose makes
        return SupportTablePartitioner(self.fb.BACKEND_IDS[self.fb.TABLE], ops, name="plain-table")

    @edgeplug.hookimpl
    def edgeplug_backends(self):
        yield edgeplug.BackendSpec(
            backend="plain-table", description="a support table, no rewrites", backend_id=self.fb.BACKEND_IDS[self.fb.TABLE],
            partitioner=self.partitioner,
        )


class ItsRewrites:
    """Another plugin adding the core's rewrites to that backend through the passes hook."""

    @edgeplug.hookimpl
    def edgeplug_passes(self):
        yield rewrite_pass("mean_at_rank", backend="plain-table", rank=4, dims=(2, 3))
        yield rewrite_pass("unsqueeze_as_view", backend="plain-table", except_trailing=True)
        yield rewrite_pass("squeeze_as_view", backend="plain-table")
        yield rewrite_pass("expand_as_cat", backend="plain-table", distinct_inputs=True)
        yield rewrite_pass("scalar_to_tensor", backend="plain-table", after="expand_as_cat")


def test_a_third_party_backend_chooses_rewrites_through_the_passes_hook(edgeplug_register, fixture_backends):
    model, inputs = RewriteBlock(), block_inputs()
    edgeplug_register(PlainTable(fixture_backends), "plain-table")
    plain = edgeplug.lower(model, inputs, "plain-table").report
    edgeplug_register(ItsRewrites(), "plain-table-rewrites")
    result = edgeplug.lower(model, inputs, "plain-table")
    report = result.report
    for op in ("aten.unsqueeze_copy.default", "aten.expand_copy.default", "aten.mul.Scalar", "aten.sub.Scalar",
               "aten.squeeze_copy.dims"):
        assert plain.cpu_ops.get(op) and not report.cpu_ops.get(op), op
    assert sum(report.cpu_ops.values()) == 0 < sum(plain.cpu_ops.values())
    assert len(report.partitions) == 1
    assert Counter(t.transform for t in report.transforms) == {
        "mean_at_rank": 1, "unsqueeze_as_view": 1, "squeeze_as_view": 1, "expand_as_cat": 1, "scalar_to_tensor": 2,
    }


class _Rms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


@pytest.mark.parametrize(
    "backend, stage, fused",
    [("fixture-keep", "pre_partition", True), ("fixture-keep", "edge", True),
     ("fixture-fused", "pre_partition", True), ("fixture-fused", "edge", False)],
)
def test_rewrites_run_after_the_fusion_unless_asked_to_run_before(edgeplug_register, fixture_backends, backend, stage, fused):
    """By default a rewrite cannot hide a norm from the fusion: it runs after it (stage "pre_partition").
    An aten-namespace target (fixture-keep's aten.rms_norm) fuses on the aten program, before every edge pass;
    a backend's own op (fixture-fused's edgeplug_fixture.rms_norm) fuses on the edge program, so an edge-stage
    rewrite asked to run before it can change what the matcher sees."""

    class MeanAtRank:
        @edgeplug.hookimpl
        def edgeplug_passes(self):
            yield rewrite_pass("mean_at_rank", backend=backend, stage=stage, rank=4, dims=(2, 3))

    edgeplug_register(MeanAtRank(), name=f"mean-at-rank-{backend}-{stage}")
    report = edgeplug.lower(_Rms(), (torch.randn(1, 2, 8),), backend, dry_run=True).report
    rewritten = [t for t in report.transforms if t.transform == "mean_at_rank"]
    if fused:
        [fusion] = report.fusions
        assert fusion.outcome == "fused" and not rewritten  # the mean is inside the fused norm
    else:  # before the fusion the mean is a 4-d view chain: the norm matcher no longer sees a norm
        assert not any(f.outcome == "fused" for f in report.fusions)
        assert [t.outcome for t in rewritten] == ["applied"]


def test_rewrite_pass_refuses_the_export_stage():
    with pytest.raises(ValueError, match="stage must be 'edge' or 'pre_partition'"):
        rewrite_pass("scalar_to_tensor", backend="fixture-table", stage="export")


def test_a_plugins_own_rewrite_written_with_the_toolkit(edgeplug_register, fixture_backends):
    """The guide's recipe: a pre-partition PassSpec built with edgeplug.plugin's toolkit, its returned records in the report."""
    from edgeplug import PassSpec
    from edgeplug.plugin import NodeBuilder, PassResult, calls_to, is_plain, note_rewrite, tensor_of

    def relu_as_clamp(ep):
        build = NodeBuilder(ep)
        records = []
        for node in calls_to(ep, ["aten.relu.default"]):
            if is_plain(tensor_of(node), (torch.float32,)):
                records.append(note_rewrite("relu_as_clamp", node, 1, "relu as clamp(min=0)"))
                build.replace(node, build.call(node, "clamp", (node.args[0], 0.0)))
        return PassResult(ep, records)

    class ReluAsClamp:
        @edgeplug.hookimpl
        def edgeplug_passes(self):
            yield PassSpec(backend=fixture_backends.OFFLINE, stage="pre_partition", name="relu_as_clamp", fn=relu_as_clamp)

    edgeplug_register(ReluAsClamp(), name="relu-as-clamp")
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    result = edgeplug.lower(model, (torch.randn(2, 4),), fixture_backends.OFFLINE, dry_run=True)
    [record] = [t for t in result.report.transforms if t.transform == "relu_as_clamp"]
    assert record.outcome == "applied" and record.op == "aten.relu.default" and record.added == 1
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    gm = result.edge.exported_program().graph_module  # the dry run's partitions are lowered (to a stand-in)
    graphs = [gm.graph, *(lm.original_module.graph for _, lm, _ in get_lowered_submodules(gm))]
    ops = {op_name(n) for g in graphs for n in g.nodes if n.op == "call_function"}
    ops = {op.rsplit(".", 1)[0] for op in ops}  # clamp is not in the backend's table: the CPU's out variant
    assert "aten.clamp" in ops and "aten.relu" not in ops
