"""What executorch's XNNPACK partitioner takes of the core's canonicalizing rewrites (edgeplug._graph.canonical).

For each rewrite the xnnpack backend declares: XNNPACK's own partitioner config refuses the op before and
takes what the rewrite leaves; a third party's backend over XNNPACK's partitioner choosing those rewrites
through the passes hook; and the xnnpack backend lowering a decoder with no rewritten op on the CPU.
The rewrites' exactness, records and what they leave alone are the core's tests (tests/test_canonical.py).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

import edgeplug
from edgeplug._graph.ops import op_name
from edgeplug.plugin import rewrite_pass
from edgeplug.testing.rewrites import RewriteBlock, RewritePieces, block_inputs, edge_program, rewritten


@pytest.fixture(scope="session")
def block_edge():
    return edge_program(RewriteBlock(), block_inputs()), block_inputs()


@pytest.fixture(scope="session")
def pieces_edge():
    return edge_program(RewritePieces(), block_inputs()), block_inputs()


@pytest.fixture(scope="session")
def decoder(zoo):
    """edgeplug._zoo's one-layer transformers Llama as an edge program, its inputs."""
    pytest.importorskip("transformers")
    from executorch.exir import EdgeCompileConfig, to_edge

    model, inputs = zoo.build("llama", 1)
    with torch.no_grad():
        ep = torch.export.export(model, inputs)
    return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program(), inputs


def _xnnpack_takes(node, ep) -> bool:
    """executorch's XNNPACK partitioner config for ``node``'s op accepts it."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS

    configs = {c.target_name: c for c in (cls() for cls in ALL_PARTITIONER_CONFIGS) if hasattr(c, "target_name")}
    config = configs.get(op_name(node).removeprefix("aten."))
    return config is not None and config.check_constraints(node, ep)


def _calls(ep, name: str) -> list:
    return [n for n in ep.graph_module.graph.nodes if n.op == "call_function" and op_name(n) == name]


def test_scalar_ops_become_tensor_ops_xnnpack_takes(block_edge, decoder):
    for ep, _ in (block_edge, decoder):
        scalars = _calls(ep, "aten.mul.Scalar")
        assert scalars and not any(_xnnpack_takes(n, ep) for n in scalars)
        after, records = rewritten(ep, "scalar_to_tensor")
        tensors = _calls(after, "aten.mul.Tensor")
        assert records and not _calls(after, "aten.mul.Scalar") and all(_xnnpack_takes(n, after) for n in tensors)


def test_mean_at_rank_4_is_what_xnnpack_takes(decoder):
    ep, _ = decoder
    means = _calls(ep, "aten.mean.dim")
    assert means and not any(_xnnpack_takes(n, ep) for n in means)
    after, _ = rewritten(ep, "mean_at_rank", rank=4, dims=(2, 3))
    assert all(_xnnpack_takes(n, after) for n in _calls(after, "aten.mean.dim"))


def test_unsqueeze_and_squeeze_as_views_xnnpack_takes(block_edge):
    ep, _ = block_edge
    (unsqueeze,) = _calls(ep, "aten.unsqueeze_copy.default")
    assert not _xnnpack_takes(unsqueeze, ep)  # not on the trailing dim
    after, _ = rewritten(ep, "unsqueeze_as_view")
    after, _ = rewritten(after, "squeeze_as_view")
    views = _calls(after, "aten.view_copy.default")
    assert views and all(_xnnpack_takes(n, after) for n in views)


def test_an_unsqueeze_of_the_trailing_dim_is_left_because_xnnpack_takes_it():
    class Trailing(nn.Module):
        def forward(self, x):
            return x.unsqueeze(-1).unsqueeze(0) + 1

    ep = edge_program(Trailing(), (torch.randn(3, 4),))
    after, _ = rewritten(ep, "unsqueeze_as_view", except_trailing=True)
    (kept,) = _calls(after, "aten.unsqueeze_copy.default")
    assert _xnnpack_takes(kept, after)


def test_xnnpack_takes_a_cat_of_distinct_inputs_only(block_edge, decoder):
    for ep, _ in (block_edge, decoder):
        after, _ = rewritten(ep, "expand_as_cat", distinct_inputs=True)
        cats = [n for n in _calls(after, "aten.cat.default") if n.name not in {c.name for c in _calls(ep, "aten.cat.default")}]
        assert cats and all(_xnnpack_takes(c, after) for c in cats)
    # without distinct inputs XNNPACK counts one input and refuses the cat
    after, _ = rewritten(block_edge[0], "expand_as_cat")
    (cat,) = _calls(after, "aten.cat.default")
    assert len(set(cat.args[0])) == 1 and not _xnnpack_takes(cat, after)


def test_splits_and_selects_become_slices_xnnpack_takes(pieces_edge):
    ep, _ = pieces_edge
    after, _ = rewritten(ep, "split_as_slices")
    after, _ = rewritten(after, "select_as_slice")
    slices = _calls(after, "aten.slice_copy.Tensor")
    assert len(slices) == 3 + 3 + 2 and all(_xnnpack_takes(n, after) for n in slices)


def _xnnpack_partitioner():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner()


class PlainXnnpack:
    """A third party's backend over executorch's XNNPACK partitioner, with no passes of its own."""

    @edgeplug.hookimpl
    def edgeplug_backends(self):
        yield edgeplug.BackendSpec(
            backend="plain-xnnpack", description="XNNPACK, no rewrites", backend_id="XnnpackBackend",
            partitioner=_xnnpack_partitioner, verify_method="pte",
        )


class ItsRewrites:
    """Another plugin adding the core's rewrites to that backend through the passes hook."""

    @edgeplug.hookimpl
    def edgeplug_passes(self):
        yield rewrite_pass("mean_at_rank", backend="plain-xnnpack", rank=4, dims=(2, 3))
        yield rewrite_pass("unsqueeze_as_view", backend="plain-xnnpack", except_trailing=True)
        yield rewrite_pass("squeeze_as_view", backend="plain-xnnpack")
        yield rewrite_pass("expand_as_cat", backend="plain-xnnpack", distinct_inputs=True)
        yield rewrite_pass("scalar_to_tensor", backend="plain-xnnpack", after="expand_as_cat")


def test_a_third_party_backend_chooses_rewrites_through_the_passes_hook(edgeplug_register):
    model, inputs = RewriteBlock(), block_inputs()
    edgeplug_register(PlainXnnpack(), "plain-xnnpack")
    plain = edgeplug.lower(model, inputs, "plain-xnnpack").report
    edgeplug_register(ItsRewrites(), "plain-xnnpack-rewrites")
    result = edgeplug.lower(model, inputs, "plain-xnnpack")
    report = result.report
    for op in ("aten.mean.dim", "aten.unsqueeze_copy.default", "aten.expand_copy.default", "aten.mul.Scalar",
               "aten.squeeze_copy.dims"):
        assert plain.cpu_ops.get(op) and not report.cpu_ops.get(op), op
    assert sum(report.cpu_ops.values()) == 0 < sum(plain.cpu_ops.values())
    assert len(report.partitions) == 1
    assert Counter(t.transform for t in report.transforms) == {
        "mean_at_rank": 1, "unsqueeze_as_view": 1, "squeeze_as_view": 1, "expand_as_cat": 1, "scalar_to_tensor": 2,
    }
    assert edgeplug.verify(result, "plain-xnnpack").max_abs_diff <= 1e-5


def test_xnnpack_lowers_a_decoder_with_no_norm_op_and_no_rewritten_op_on_the_cpu(zoo):
    pytest.importorskip("transformers")
    if "xnnpack" not in edgeplug.backends():
        pytest.skip("the xnnpack plugin is not installed")
    _, ep, inputs, _ = zoo.exported("llama", 1)
    result = edgeplug.lower(ep, inputs, "xnnpack")
    cpu = result.report.cpu_ops
    for op in ("aten.mean.dim", "aten.rsqrt.default", "aten.mul.Scalar", "aten.unsqueeze_copy.default",
               "aten.expand_copy.default", "aten.alias_copy.default"):
        assert not cpu.get(op), (op, cpu)
    done = {t.transform for t in result.report.transforms}
    assert done >= {"mean_at_rank", "scalar_to_tensor", "unsqueeze_as_view", "expand_as_cat", "drop_identity_copies"}
    assert edgeplug.verify(result, "xnnpack").max_abs_diff <= 1e-4


