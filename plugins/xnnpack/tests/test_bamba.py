"""Bamba (a Mamba-2 hybrid) on XNNPACK: the exact rewrites of masks, fills and scans (``edgeplug._graph.canonical``).

A Mamba-2 mixer reaches XNNPACK's partitioner with its depthwise conv weight
squeezed and unsqueezed back (so the conv is refused: "Expected weight to be a
static param"), its segment sums masked by constant triangles (``where``), its
chunk states started from ``full_like(x, 0)`` and, with one chunk, a scan of
two values (``cumsum``): none of which XNNPACK takes. Each rewrite is checked
on a small module holding that op, with values that tell rounding and signed
zeros apart (bitwise equal before and after, records that match the graph,
executorch's XNNPACK configs take what it made), then what it must leave
alone; last, bamba from edgeplug._zoo on the xnnpack backend.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import edgeplug
from edgeplug.plugin import apply_rewrite
from edgeplug._graph.ops import op_name

LENGTH = 4


class Mixer(nn.Module):
    """The parts of a Mamba-2 mixer the rewrites are for, at toy size."""

    def __init__(self, channels: int = 6) -> None:
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, 3, groups=channels, padding=2)
        self.register_buffer("keep", torch.tril(torch.ones(LENGTH, LENGTH, dtype=torch.bool)))
        self.register_buffer("below", torch.tril(torch.ones(2, 2, dtype=torch.bool), -1))

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        # the conv as transformers' Bamba runs it: its weight squeezed, then unsqueezed back
        weight = self.conv.weight.squeeze(1).unsqueeze(1)
        h = nn.functional.conv1d(x, weight, self.conv.bias, padding=2, groups=x.shape[1])[..., : x.shape[-1]]
        # a segment sum over one chunk: masks are constant triangles, the scan has two values
        seg = a[..., None].expand(*a.shape, 2).masked_fill(~self.below, 0).cumsum(-2)
        seg = seg.masked_fill(~self.keep[:2, :2], -torch.inf)
        decay = torch.exp(seg).sum(-1)
        # chunk states that start from zeros, and a triangle over a longer dim
        states = torch.cat([torch.full_like(h[:, :1], 0), h], dim=1)
        lower = h[..., :LENGTH, None].expand(*h.shape[:-1], LENGTH, LENGTH).masked_fill(~self.keep, 0.0)
        return states[:, 1:, :LENGTH] * decay.mean() + lower.sum(-1)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 6, 5, generator=g) * 1e3
    x[0, 0, :3] = torch.tensor([-0.0, 1e-42, -3e38])  # a signed zero, a subnormal, near overflow
    a = torch.randn(1, 3, 2, generator=g)
    a[0, 0] = torch.tensor([-0.0, -0.0])
    a[0, 1] = torch.tensor([1.0, 2.0**-24])  # their sum rounds
    return x, a


@pytest.fixture(scope="module")
def mixer_edge():
    """The Mixer's edge program (every constant folded, as lowering does before these rewrites)."""
    from executorch.exir import EdgeCompileConfig, to_edge

    from edgeplug._graph.fold import fold_constant_subgraphs

    torch.manual_seed(0)
    with torch.no_grad():
        ep = torch.export.export(Mixer().eval(), _inputs())
    edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    fold_constant_subgraphs(edge)
    edge.graph_module.recompile()
    for name in ("squeeze_as_view", "unsqueeze_as_view"):  # what the xnnpack plugin runs first
        apply_rewrite(edge, name)
    return edge


def _run(ep, inputs) -> torch.Tensor:
    with torch.no_grad():
        return ep.module()(*inputs)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (``torch.equal`` takes -0 for +0 and no NaN for itself)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def _calls(ep, name: str) -> list:
    return [n for n in ep.graph_module.graph.nodes if n.op == "call_function" and op_name(n) == name]


def _applied(ep, name: str, **params):
    after = copy.deepcopy(ep)
    records = apply_rewrite(after, name, **params)
    return after, records


def _xnnpack_takes(node, ep) -> bool:
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS

    configs = {c.target_name: c for c in (cls() for cls in ALL_PARTITIONER_CONFIGS) if hasattr(c, "target_name")}
    config = configs.get(op_name(node).removeprefix("aten."))
    return config is not None and config.check_constraints(node, ep)


def _node_count(ep) -> int:
    return sum(1 for n in ep.graph_module.graph.nodes if n.op in ("call_function", "placeholder"))


# -- each rewrite: exact, recorded, and what it makes is what XNNPACK takes ------------------------

CASES = {
    "collapse_view_chains": "aten.convolution.default",
    "where_static_mask": "aten.where.self",
    "cat_fill_as_pad": "aten.full_like.default",
    "short_cumsum_as_adds": "aten.cumsum.default",
}


@pytest.mark.parametrize("name", CASES)
def test_rewrite_is_bitwise_exact_and_recorded(name, mixer_edge):
    after, records = _applied(mixer_edge, name)
    assert records, f"{name} changed nothing"
    assert _same_bits(_run(after, _inputs()), _run(mixer_edge, _inputs()))
    assert _node_count(after) - _node_count(mixer_edge) == sum(r.added - r.removed for r in records)
    assert all((r.transform, r.kind) == (name, "rewrite") for r in records)


def test_the_conv_weight_is_the_parameter_again_and_xnnpack_takes_the_conv(mixer_edge):
    (conv,) = _calls(mixer_edge, "aten.convolution.default")
    assert not _xnnpack_takes(conv, mixer_edge)  # its weight is a view of a view of the parameter
    after, _ = _applied(mixer_edge, "collapse_view_chains")
    (conv,) = _calls(after, "aten.convolution.default")
    assert conv.args[1].op == "placeholder" and _xnnpack_takes(conv, after)


def test_masks_fills_and_the_short_scan_become_ops_xnnpack_takes(mixer_edge):
    after = copy.deepcopy(mixer_edge)
    for name in ("where_static_mask", "cat_fill_as_pad", "short_cumsum_as_adds"):
        apply_rewrite(after, name)
    assert _same_bits(_run(after, _inputs()), _run(mixer_edge, _inputs()))
    for gone in ("aten.where.self", "aten.full_like.default", "aten.cumsum.default"):
        assert not _calls(after, gone), gone
    made = set()
    for n in after.graph_module.graph.nodes:
        if n.op == "call_function" and op_name(n) in ("aten.constant_pad_nd.default", "aten.slice_copy.Tensor", "aten.cat.default"):
            assert _xnnpack_takes(n, after), n.format_node()
            made.add(op_name(n))
    assert made == {"aten.constant_pad_nd.default", "aten.slice_copy.Tensor", "aten.cat.default"}


def test_a_triangle_needs_a_piece_per_row_and_max_pieces_caps_it(mixer_edge):
    triangles = [n for n in _calls(mixer_edge, "aten.where.self") if list(n.meta["val"].shape)[-1] == LENGTH]
    assert triangles
    _, records = _applied(mixer_edge, "where_static_mask", max_pieces=LENGTH)
    assert any(f"{LENGTH} piece(s)" in r.detail for r in records)
    _, records = _applied(mixer_edge, "where_static_mask", max_pieces=LENGTH - 1)
    assert records and not any(r.node in {t.name for t in triangles} for r in records)  # the 2x2 masks only


# -- the two-value scan: exact for every pair, in every float type, refused beyond -----------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_adds_from_zero_equal_eager_cumsum_for_any_two_values(dtype):
    info = torch.finfo(dtype)
    g = torch.Generator().manual_seed(0)
    mant = torch.rand(20000, 2, generator=g) * 2 - 1
    expo = torch.randint(-30, 31, (20000, 2), generator=g).float()
    pairs = (mant * torch.pow(2.0, expo)).to(dtype)
    special = torch.tensor([0.0, -0.0, info.tiny, -info.tiny, info.max, -info.max, info.eps, 1.0, float("inf"), float("nan")], dtype=dtype)
    pairs = torch.cat([pairs, torch.cartesian_prod(special, special)])
    first = pairs[:, :1] + torch.zeros((), dtype=dtype)
    adds = torch.cat([first, first + pairs[:, 1:]], dim=1)
    scan = torch.cumsum(pairs, dim=1)
    same = (adds == scan) | (adds.isnan() & scan.isnan())
    assert bool(same.all()) and torch.equal(torch.signbit(adds), torch.signbit(scan))
    three = torch.tensor([[1.0, 2.0**-24, 2.0**-24]])  # a longer scan rounds once at the end in eager
    assert torch.cumsum(three, 1)[0, 2] != (three[0, 0] + three[0, 1]) + three[0, 2]


def test_a_scan_of_three_is_left_and_max_length_is_checked():
    from executorch.exir import to_edge

    class Scan(nn.Module):
        def forward(self, x):
            return x.cumsum(-1) + x[..., :1].cumsum(-1)

    ep = to_edge(torch.export.export(Scan(), (torch.randn(2, 3),))).exported_program()
    _, records = _applied(ep, "short_cumsum_as_adds")
    assert [r.detail.split(" along")[0] for r in records] == ["cumsum of 1"]
    with pytest.raises(ValueError, match="max_length must be 1 or 2"):
        apply_rewrite(ep, "short_cumsum_as_adds", max_length=3)


# -- what the mask rewrite must leave alone ---------------------------------------------------------


class Masks(nn.Module):
    """``where`` forms that are not a constant mask of one run per row with a one-value fill."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("checker", torch.tensor([[True, False, True], [False, True, False]]))
        self.register_buffer("per_batch", torch.tensor([[[True, False, False]] * 2, [[False, True, True]] * 2]))
        self.register_buffer("hole", torch.tensor([[True, True, True], [False, False, False], [True, True, True]]))
        self.register_buffer("ramp", torch.arange(6.0).reshape(2, 3))
        self.register_buffer("box", torch.tensor([[False, True, True], [False, True, True]]))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        runtime = x > 0
        return (
            torch.where(runtime, x, 0.0)                     # the mask is computed at run time
            + torch.where(self.checker, x, 0.0)              # two runs in a row
            + torch.where(self.per_batch, x, 0.0)            # differs along the leading dim
            + torch.where(self.checker, x, self.ramp)        # the fill holds more than one value
            + torch.where(self.checker, x, float("nan"))     # a NaN fill (its payload)
            + torch.where(self.hole, y, 0.0)[:2]             # an empty row between full ones
            + torch.where(self.box, x, 0.0)                  # the one it takes: a box
        )


def test_where_forms_it_cannot_prove_are_left():
    from executorch.exir import EdgeCompileConfig, to_edge

    inputs = (torch.randn(2, 2, 3), torch.randn(3, 3))
    from edgeplug._graph.fold import fold_constant_subgraphs

    ep = to_edge(torch.export.export(Masks(), inputs), compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    fold_constant_subgraphs(ep)  # the fills become constants, as in a lowering
    assert len(_calls(ep, "aten.where.self")) == 7
    after, records = _applied(ep, "where_static_mask", max_pieces=8)
    assert len(records) == 1 and "rows:cols 0:2,1:3" in records[0].detail  # the box only
    assert len(_calls(after, "aten.where.self")) == 6 and _same_bits(_run(after, inputs), _run(ep, inputs))


def test_a_view_returned_by_the_program_stays_and_a_cat_of_three_is_left():
    from executorch.exir import to_edge

    class Views(nn.Module):
        def forward(self, x):
            return x.view(6).view(2, 3), torch.cat([torch.full_like(x, 0.0), x, x], 0)

    ep = to_edge(torch.export.export(Views(), (torch.randn(2, 3),))).exported_program()
    after, records = _applied(ep, "collapse_view_chains")
    out = [n for n in after.graph_module.graph.nodes if n.op == "output"][0].args[0][0]
    assert op_name(out) == "aten.view_copy.default" and out.args[0].op == "placeholder"  # rerouted, kept
    assert [r.removed for r in records] == [1]  # the inner view, read by nothing now
    assert _calls(ep, "aten.full_like.default") and _applied(ep, "cat_fill_as_pad")[1] == []


# -- bamba from the zoo ------------------------------------------------------------------------------


@pytest.mark.slow
def test_bamba_on_xnnpack_has_at_most_three_partitions_and_verifies(zoo):
    pytest.importorskip("transformers")
    _, ep, inputs, _ = zoo.exported("bamba", 1)
    result = edgeplug.lower(copy.deepcopy(ep), inputs, "xnnpack", model_name="bamba")
    report = result.report
    assert len(report.partitions) <= 3, report.cpu_ops  # stock executorch: 11 partitions, 70 CPU nodes
    cpu = dict(report.cpu_ops)
    assert "aten.convolution.default" not in cpu and "aten.full_like.default" not in cpu
    assert not {"aten.rsqrt.default", "aten.mean.dim", "aten.rms_norm.default"} & set(cpu)
    applied = {t.transform for t in report.transforms}
    assert {"collapse_view_chains", "where_static_mask", "cat_fill_as_pad", "short_cumsum_as_adds"} <= applied
    verification = edgeplug.verify(result, "xnnpack")
    assert verification.passed, verification.failures()
