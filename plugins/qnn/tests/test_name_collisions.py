"""The three models whose backend passes hit "Node redefined name" without the reservation.

Each goes through ``edgeplug.transform`` (QNN: autocast regions, attention;
Samsung: roll) and lowers, computing what eager computes. Each is also run
with ``reserve_node_names`` patched out to show the failure it prevents; if a
torch upgrade makes export record its names, that half is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edgeplug
import edgeplug._graph.passes as runner
from edgeplug._errors import PassError
from edgeplug._graph.names import UPSTREAM_ISSUE, used_names


class AutocastTwice(nn.Module):
    """An input named ``t_1`` and an autocast region that transposes twice."""

    def forward(self, t_1):
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            z = t_1.t().t() @ t_1
        return z.float() + 1


class AttentionMul(nn.Module):
    """An input named ``mul`` and scaled-dot-product attention."""

    def forward(self, q, k, mul):
        return F.scaled_dot_product_attention(q * 2, k, mul)


class CatRoll(nn.Module):
    """An input named ``cat``, ``torch.cat`` then ``torch.roll``."""

    def forward(self, cat):
        return torch.roll(torch.cat([cat, cat * 2], dim=-1), 1, -1)


@dataclass
class Case:
    model: nn.Module
    inputs: tuple
    backend: str
    input_name: str  # the placeholder export names after the model's argument
    collides: str  # the name a decomposition would take again
    removed: str  # what the backend's passes decompose away


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


CASES = {
    "autocast": Case(AutocastTwice(), (torch.randn(4, 4, generator=_gen()),), "qnn", "t_1", "t_1", "wrap_with_autocast"),
    "attention": Case(
        AttentionMul(), tuple(torch.randn(1, 2, 4, 8, generator=_gen()) for _ in range(3)), "qnn", "mul", "mul_1", "scaled_dot_product_attention"
    ),
    "roll": Case(CatRoll(), (torch.randn(2, 3, generator=_gen()),), "samsung", "cat", "cat_1", "roll"),
}


def _export(case: Case):
    return torch.export.export(case.model, case.inputs)


def _targets(ep) -> set[str]:
    return {str(n.target) for gm in ep.graph_module.modules() if isinstance(gm, torch.fx.GraphModule) for n in gm.graph.nodes}


@pytest.mark.parametrize("key", CASES)
def test_the_collision_is_set_up(key):
    # guard against a vacuous test: the names must be the colliding ones, and unrecorded
    case = CASES[key]
    ep = _export(case)
    names = {n.name for n in ep.graph.nodes}
    assert case.input_name in {n.name for n in ep.graph.nodes if n.op == "placeholder"}
    assert case.collides in names
    if case.collides in used_names(ep.graph):
        pytest.skip(f"torch {torch.__version__} records {case.collides!r} ({UPSTREAM_ISSUE} fixed?)")
    assert any(case.removed in t for t in _targets(ep))


@pytest.mark.parametrize("key", CASES)
def test_fails_without_the_reservation(key, monkeypatch):
    case = CASES[key]
    monkeypatch.setattr(runner, "reserve_node_names", lambda ep: 0)
    ep = _export(case)
    try:
        edgeplug.transform(ep, case.backend)
    except PassError as err:
        assert f"Node redefined name {case.collides}!" in str(err)
        assert f"backend {case.backend!r}" in str(err)
    else:
        pytest.skip(f"torch {torch.__version__} no longer collides on {case.collides!r} ({UPSTREAM_ISSUE} fixed?)")


@pytest.mark.parametrize("key", CASES)
def test_transform_with_the_reservation(key):
    case = CASES[key]
    ep = edgeplug.transform(_export(case), case.backend)
    assert not any(case.removed in t for t in _targets(ep)), f"{case.removed} was not decomposed"
    for gm in ep.graph_module.modules():
        if isinstance(gm, torch.fx.GraphModule):
            gm.graph.lint()
            names = [n.name for n in gm.graph.nodes]
            assert len(names) == len(set(names))
    torch.testing.assert_close(ep.module()(*case.inputs), case.model(*case.inputs), rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("key", CASES)
def test_lowers_and_matches_eager(key):
    # the vendor SDKs are absent here: a dry run goes through to_edge, the
    # edge passes and partitioning; the edge program then runs on the host
    case = CASES[key]
    result = edgeplug.lower(case.model, case.inputs, case.backend, dry_run=True)
    edge = result.edge.exported_program()
    assert not any(case.removed in t for t in _targets(edge))
    assert result.report.partitions, "nothing was partitioned"
    torch.testing.assert_close(edge.module()(*case.inputs), case.model(*case.inputs), rtol=0, atol=1e-6)


# the backend passes themselves, beyond the collision models --------------------


class NestedAutocast(nn.Module):
    """A disabled region inside an enabled one: the inner matmul stays fp32."""

    def forward(self, x):
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            y = x @ x
            with torch.autocast(device_type="cpu", enabled=False):
                z = y.float() @ x
        return y.float() + z


class Remainders(nn.Module):
    def forward(self, x, i):
        return (
            torch.remainder(x, 0.7),
            torch.remainder(x, x.flip(0) + 3),  # a tensor divisor
            torch.remainder(i, 3),
            torch.remainder(i, -4),  # the result takes the divisor's sign
            torch.remainder(5.0, x + 10),  # a scalar dividend
        )


def test_qnn_inlines_nested_autocast_regions_with_their_casts():
    x = torch.randn(4, 4, generator=_gen())
    ep = edgeplug.transform(torch.export.export(NestedAutocast(), (x,)), "qnn")
    targets = _targets(ep)
    assert not any("wrap_with_autocast" in t for t in targets)
    assert "aten._to_copy.default" in targets  # autocast's casts are explicit now
    mms = [n for n in ep.graph.nodes if str(n.target) == "aten.mm.default"]
    assert [n.meta["val"].dtype for n in mms] == [torch.bfloat16, torch.float32]
    torch.testing.assert_close(ep.module()(x), NestedAutocast()(x), rtol=0, atol=0)


def test_samsung_remainder_matches_eager():
    inputs = (torch.randn(8, generator=_gen()) * 5, torch.arange(-8, 8))
    ep = edgeplug.transform(torch.export.export(Remainders(), inputs), "samsung")
    assert not any("remainder" in t for t in _targets(ep))
    for got, want in zip(ep.module()(*inputs), Remainders()(*inputs), strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
