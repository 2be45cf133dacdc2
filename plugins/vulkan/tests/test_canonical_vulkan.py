"""The core's rewrites for the Vulkan delegate's limits (edgeplug._graph.canonical), on real exported programs.

``collapse_rank`` (elementwise ops and ``cat`` past 4 dims, as in a Mamba-2
scan), ``int_sum_in_float`` (a MoE router's integer counts) and
``reduce_with_keepdim`` (a MoE's sum over its experts): outputs bit-equal
before and after, records that match the graph, what each must leave alone,
and that executorch's Vulkan partitioner takes what they leave (node by node,
and through ``edgeplug.lower`` with the vulkan backend).
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch import nn

import edgeplug
from edgeplug._graph.canonical.reductions import integer_range
from edgeplug.plugin import apply_rewrite
from edgeplug._graph.ops import op_name


def _edge(model: nn.Module, inputs: tuple, dynamic_shapes=None):
    from executorch.exir import EdgeCompileConfig, to_edge

    ep = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()


def _ops(ep) -> Counter:
    return Counter(op_name(n) for n in ep.graph_module.graph.nodes if n.op == "call_function")


def _calls(ep, name: str) -> list:
    return [n for n in ep.graph_module.graph.nodes if n.op == "call_function" and op_name(n) == name]


def _node_count(ep) -> int:
    return sum(1 for n in ep.graph_module.graph.nodes if n.op in ("call_function", "placeholder"))


def _run(ep, inputs) -> list[torch.Tensor]:
    with torch.no_grad():
        out = ep.module()(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _applied(ep, name: str, inputs: tuple, **params):
    """A rewritten copy of ``ep`` and the records the rewrite returned, checked: bit-equal outputs, records as the graph changed."""
    after = copy.deepcopy(ep)
    records = apply_rewrite(after, name, **params)
    before_out, after_out = _run(ep, inputs), _run(after, inputs)
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(after_out, before_out))
    before_ops = {n.name: op_name(n) for n in ep.graph_module.graph.nodes}
    names = {n.name for n in after.graph_module.graph.nodes}
    for r in records:
        assert (r.transform, r.kind) == (name, "rewrite") and r.node not in names and before_ops[r.node] == r.op
    assert _node_count(after) - _node_count(ep) == sum(r.added - r.removed for r in records)
    return after, records


def _untouched(ep, name: str, inputs: tuple, **params) -> None:
    after, records = _applied(ep, name, inputs, **params)
    assert records == [] and _ops(after) == _ops(ep)


def _vulkan_check():
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    from edgeplug_vulkan_delegate.support import support_check

    return support_check(VulkanPartitioner())


def _new_nodes(before, after) -> list:
    old = {n.name for n in before.graph_module.graph.nodes}
    return [n for n in after.graph_module.graph.nodes if n.op == "call_function" and n.name not in old]


# -- collapse_rank ---------------------------------------------------------------------------------


class Scan(nn.Module):
    """A Mamba-2 chunked scan's 5-d ops: a causal mask (2-d, bool) and a 0-d fill broadcast over
    5 dims, exp, a zero block cat before the states along dim 1."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mask", torch.tril(torch.ones(8, 8, dtype=torch.bool)))

    def forward(self, x: torch.Tensor, states: torch.Tensor):
        segsum = torch.where(~self.mask, torch.tensor(float("-inf")), x)  # [1, 3, 2, 8, 8]
        decay = segsum.exp()
        zeros = torch.full_like(states, 0)
        return decay, torch.cat([zeros, states], dim=1), torch.where(self.mask, decay, segsum)


def _scan_inputs(dtype: torch.dtype = torch.float32) -> tuple:
    g = torch.Generator().manual_seed(0)
    return torch.randn(1, 3, 2, 8, 8, generator=g).to(dtype), torch.randn(1, 1, 4, 16, 8, generator=g).to(dtype)


VULKAN_FOUR_DIM = ("aten.exp.default", "aten.where.self", "aten.full_like.default", "aten.cat.default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_five_dim_elementwise_ops_and_cat_run_at_rank_4_bit_for_bit(dtype):
    inputs = _scan_inputs(dtype)
    ep = _edge(Scan(), inputs)
    check = _vulkan_check()
    if dtype == torch.float32:  # Vulkan's float types: refused for their rank alone
        assert all("high dim" in check(n).reason for name in VULKAN_FOUR_DIM for n in _calls(ep, name))
    after, records = _applied(ep, "collapse_rank", inputs, max_rank=4, ops=VULKAN_FOUR_DIM)
    assert Counter(r.op for r in records) == {"aten.where.self": 2, "aten.exp.default": 1, "aten.full_like.default": 1,
                                              "aten.cat.default": 1}
    for name in VULKAN_FOUR_DIM:
        assert all(n.meta["val"].dim() <= 4 for n in _calls(after, name))
    # the mask broadcasts as before: [8, 8] is already the trailing part of [1, 3, 16, 8]'s view [3, 2, 8, 8]
    where = _calls(after, "aten.where.self")[0]
    assert [list(a.meta["val"].shape) for a in where.args] == [[8, 8], [], [3, 2, 8, 8]]
    (cat,) = _calls(after, "aten.cat.default")
    assert cat.args[1] == 0 and list(cat.meta["val"].shape) == [2, 4, 16, 8]  # dim 0 of size 1 joined the cat dim
    if dtype == torch.float32:
        assert all(check(n) for n in _new_nodes(ep, after)), [(n.name, check(n).reason) for n in _new_nodes(ep, after)]


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.float16])
def test_collapse_rank_holds_for_every_dtype(dtype):
    class Mixed(nn.Module):
        def forward(self, a, b, c):
            return torch.where(c, a, b), torch.cat([a, b, a], dim=-2), torch.zeros_like(b)

    g = torch.Generator().manual_seed(1)
    a = (torch.randn(2, 1, 3, 4, 5, generator=g) * 100).to(dtype)
    b = (torch.randn(2, 1, 3, 2, 5, generator=g) * 100).to(dtype)[..., :1, :].expand(2, 1, 3, 4, 5).contiguous()
    c = torch.randn(1, 3, 1, 5, generator=g) > 0  # broadcast over dims 0 and 3
    inputs = (a, b, c)
    ep = _edge(Mixed(), inputs)
    after, records = _applied(ep, "collapse_rank", inputs)
    assert {r.op for r in records} == {"aten.where.self", "aten.cat.default", "aten.full_like.default"}  # zeros_like's edge form
    cat = next(r.detail for r in records if r.op == "aten.cat.default")
    assert cat == "cat along dim 3 of [2, 1, 3, 12, 5] as a cat along dim 2 of [2, 3, 12, 5]"
    # at rank 3 the dims before the cat dim merge; the where's mask alternates too often for 3
    _, records = _applied(ep, "collapse_rank", inputs, max_rank=3)
    assert "as a cat along dim 1 of [6, 12, 5]" in next(r.detail for r in records if r.op == "aten.cat.default")
    assert "aten.where.self" not in {r.op for r in records}


def test_collapse_rank_merges_no_more_dims_than_it_must():
    class Deep(nn.Module):
        def forward(self, x, y):
            return torch.sigmoid(x), x * y

    inputs = (torch.randn(2, 3, 4, 5, 6, 7), torch.randn(4, 1, 1, 7))
    ep = _edge(Deep(), inputs)
    after, records = _applied(ep, "collapse_rank", inputs, max_rank=4)
    assert [r.detail.split(";")[0] for r in records] == [
        "[2, 3, 4, 5, 6, 7] at rank 4 as [24, 5, 6, 7]",  # the leading dims, the innermost kept
        "[2, 3, 4, 5, 6, 7] at rank 4 as [6, 4, 30, 7]",  # y reads dims 2 and 5 whole, 3 and 4 broadcast
    ]


class Unmergeable(nn.Module):
    def forward(self, x, y):
        return torch.where(x > 0, x, y)  # y [2, 1, 2, 1, 2]: whole, broadcast, whole, ... at every dim


def test_collapse_rank_leaves_alone_what_it_cannot_prove():
    # broadcasting that alternates on every dim cannot merge
    where = ["aten.where.self"]
    inputs = (torch.randn(2, 3, 2, 3, 2), torch.randn(2, 1, 2, 1, 2))
    _untouched(_edge(Unmergeable(), inputs), "collapse_rank", inputs, ops=where)
    # symbolic sizes
    dims = {"x": {0: torch.export.Dim("n", min=2, max=9)}, "y": {0: torch.export.Dim("n", min=2, max=9)}}
    inputs = (torch.randn(3, 3, 1, 3, 2), torch.randn(3, 3, 1, 3, 2))
    _untouched(_edge(Unmergeable(), inputs, dynamic_shapes=dims), "collapse_rank", inputs)  # every op
    # a non-contiguous operand
    x = torch.randn(2, 3, 4, 5, 6).to(memory_format=torch.channels_last_3d)
    inputs = (x, torch.randn(2, 3, 4, 5, 6))
    ep = _edge(Unmergeable(), inputs)
    assert not ep.graph_module.graph.find_nodes(op="placeholder")[0].meta["val"].is_contiguous()
    _untouched(ep, "collapse_rank", inputs)
    # ops at rank 4 or less, and ops it was not asked for
    inputs = (torch.randn(2, 3, 4, 5), torch.randn(1, 3, 1, 5))
    _untouched(_edge(Unmergeable(), inputs), "collapse_rank", inputs)
    inputs = (torch.randn(2, 3, 1, 4, 5), torch.randn(2, 3, 1, 4, 5))
    _untouched(_edge(Unmergeable(), inputs), "collapse_rank", inputs, ops=["aten.exp.default"])
    with pytest.raises(ValueError, match="aten.sum.dim_IntList is neither elementwise nor cat"):
        apply_rewrite(_edge(Unmergeable(), inputs), "collapse_rank", ops=["aten.sum.dim_IntList"])


# -- int_sum_in_float ------------------------------------------------------------------------------


class Router(nn.Module):
    """A MoE router's integer counts (OLMoE's token dispatch): tokens per expert, positions weighted by an
    integer constant, a bool count, and sums the rewrite cannot prove exact."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("rank", torch.arange(16).unsqueeze(0))
        self.register_buffer("huge", torch.full((1, 16), 2**21))

    def forward(self, x: torch.Tensor, counts: torch.Tensor):
        hits = (x > 0).long()
        return (
            hits.sum(1),
            (hits * self.rank).sum(-1, keepdim=True),
            (x > 0.5).sum([0, 1]),
            counts.sum(1),  # a runtime integer input: no bounds
            (hits * self.huge).sum(1),  # 16 * 2**21 > 2**24
            hits.sum(1, dtype=torch.int32),
        )


def _router_inputs() -> tuple:
    g = torch.Generator().manual_seed(2)
    return torch.randn(8, 16, generator=g), torch.randint(-5, 5, (8, 16), generator=g)


def test_integer_sums_of_proven_bounds_run_in_float_and_vulkan_takes_them():
    inputs = _router_inputs()
    ep = _edge(Router(), inputs)
    check = _vulkan_check()
    sums = _calls(ep, "aten.sum.dim_IntList")
    assert len(sums) == 6 and not any(check(n) for n in sums)
    after, records = _applied(ep, "int_sum_in_float", inputs)
    assert len(records) == 3
    assert [r.detail for r in records] == [
        "16 elements in [0, 1]: every partial sum within ±16 is exact in float32",
        "16 elements in [0, 15]: every partial sum within ±240 is exact in float32",
        "128 elements in [0, 1]: every partial sum within ±128 is exact in float32",
    ]
    new = _new_nodes(ep, after)
    assert sorted(Counter(op_name(n) for n in new).items()) == [
        ("aten.sum.dim_IntList", 3), ("dim_order_ops._to_dim_order_copy.default", 6)]
    after, _ = _applied(after, "reduce_with_keepdim", inputs)  # the sum over both dims: Vulkan reduces those with keepdim
    new = [n for n in _new_nodes(ep, after) if n.args[0].meta["val"].dtype != torch.int64 or op_name(n) != "aten.sum.dim_IntList"]
    assert all(check(n) for n in new), [(n.name, check(n).reason) for n in new if not check(n)]
    assert sum(1 for n in _calls(after, "aten.sum.dim_IntList") if not n.meta["val"].is_floating_point()) == 3


def test_integer_range_proves_only_what_it_can():
    ep = _edge(Router(), _router_inputs())
    x, counts = [n for n in ep.graph_module.graph.nodes if n.op == "placeholder"][-2:]
    assert integer_range(ep, counts) is None and integer_range(ep, x) is None
    products = [n for n in _calls(ep, "aten.mul.Tensor")]
    assert sorted(integer_range(ep, n) for n in products) == [(0, 15), (0, 2**21)]


# -- reduce_with_keepdim ---------------------------------------------------------------------------


def test_reductions_over_a_middle_dim_keep_it_and_vulkan_takes_them():
    class Experts(nn.Module):
        def forward(self, x):
            return x.sum(1), x.amax([0, 2]), x.mean(-1), x.sum(1, keepdim=True), x.sum()

    inputs = (torch.randn(8, 2, 64),)
    ep = _edge(Experts(), inputs)
    check = _vulkan_check()
    middle = _calls(ep, "aten.sum.dim_IntList")[0]
    assert check(middle).reason == "Vulkan: op args not supported"
    after, records = _applied(ep, "reduce_with_keepdim", inputs)
    assert [r.op for r in records] == ["aten.sum.dim_IntList", "aten.amax.default", "aten.mean.dim"]
    assert records[0].detail == "[8, 2, 64] reduced over [1] to [8, 1, 64], viewed as [8, 64]"
    assert all(check(n) for n in _new_nodes(ep, after))


# -- declared by the Vulkan delegate's backends ---------------------------------------------------


def test_the_vulkan_delegate_backends_declare_the_rewrites_for_their_limits():
    from executorch.backends.vulkan.op_registry import vulkan_supported_ops

    from edgeplug_vulkan_delegate.rewrites import FOUR_DIM_OPS

    # every op declared is one the delegate has a kernel for only up to 4 dims
    registered = {op_name(target): features for target, features in vulkan_supported_ops.items() if not isinstance(target, str)}
    assert all(name in registered and not registered[name].supports_highdim for name in FOUR_DIM_OPS)
    for backend in ("vulkan", "webgpu"):
        if backend not in edgeplug.backends():
            continue
        passes = {p.name for p in edgeplug.get_backend(backend).passes_for("pre_partition")}
        assert {"collapse_rank", "int_sum_in_float", "reduce_with_keepdim"} <= passes


class ScanAndRoute(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scan, self.router = Scan(), Router()

    def forward(self, x, states, tokens):
        decay, padded, masked = self.scan(x, states)
        hits = (tokens > 0).long()
        per_expert = hits.sum(1, keepdim=True).to(tokens.dtype)
        return decay.reshape(3, 16, 8).sum(1), padded * 2, masked, tokens * per_expert


def test_vulkan_lowers_five_dim_ops_and_integer_sums_in_one_partition():
    if "vulkan" not in edgeplug.backends():
        pytest.skip("the vulkan plugin is not installed")
    inputs = (*_scan_inputs(), torch.randn(8, 16))
    result = edgeplug.lower(ScanAndRoute(), inputs, "vulkan")
    report = result.report
    assert len(report.partitions) == 1 and sum(report.cpu_ops.values()) == 0, report.cpu_ops
    done = Counter(t.transform for t in report.transforms)
    assert done["collapse_rank"] == 5 and done["int_sum_in_float"] == 1 and done["reduce_with_keepdim"] == 1
    assert edgeplug.verify(result, "vulkan").max_abs_diff <= 1e-5


@pytest.mark.slow  # a lowering of each model, about 14 s apiece
@pytest.mark.parametrize("model, left, partitions", [
    # bamba: softplus's log1p and the two 8-long scans (its 2-long chunk-level scan became adds)
    ("bamba", {"aten.cumsum.default": 2, "aten.log1p.default": 1}, 3),
    # olmoe: also its integer routing (==, floor division, index of an int64 tensor), which the partitioner
    # takes but ExecuTorch's Vulkan runtime cannot run (the runtime_gaps filter; test_runtime_gaps.py)
    ("olmoe", {"aten.topk.default": 1, "aten.cumsum.default": 1, "aten.index_put.default": 1, "aten.eq.Tensor": 2,
               "aten.div.Tensor_mode": 1, "aten.index.Tensor": 1}, 6),
])
def test_zoo_decoders_leave_only_ops_without_a_vulkan_kernel_on_the_cpu(model, left, partitions):
    import edgeplug._zoo as zoo  # the built-in tiny transformers models

    pytest.importorskip("transformers")
    if "vulkan" not in edgeplug.backends():
        pytest.skip("the vulkan plugin is not installed")
    _, ep, inputs, _ = zoo.exported(model, 1)
    report = edgeplug.lower(ep, inputs, "vulkan", dry_run=True).report
    assert dict(report.cpu_ops) == left, report.cpu_ops
    assert len(report.partitions) == partitions
    assert all(c.reason == "Vulkan: no operator implementation" or "refused by filter 'runtime_gaps'" in c.reason
               for c in report.cpu_nodes), [c.reason for c in report.cpu_nodes]
