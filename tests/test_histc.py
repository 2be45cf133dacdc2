"""The core's decomposition of ``aten.histc`` (edgeplug._graph.histc).

It must equal ``torch.histc`` bit for bit wherever it applies (integer-valued
and general floats, values on the edges, outside the range, NaN and
infinities), refuse what it cannot prove (``min == max``), and let OLMoE, whose
expert routing calls ``histc``, lower where stock executorch cannot.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

from edgeplug._graph.histc import decompose_histc, histc_refusal

HISTC = torch.ops.aten.histc.default


class Histc(torch.nn.Module):
    def __init__(self, bins: int, low: float, high: float) -> None:
        super().__init__()
        self.bins, self.low, self.high = bins, low, high

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.histc(x, bins=self.bins, min=self.low, max=self.high)


def _decomposed(bins, low, high, x):
    ep = torch.export.export(Histc(bins, low, high), (x,))
    records = decompose_histc(ep)
    ep.graph_module.recompile()
    return ep, records


def _targets(ep) -> set:
    return {n.target for n in ep.graph.nodes if n.op == "call_function"}


def _hard_values(bins, low, high, dtype, generator) -> torch.Tensor:
    """Random values over and around the range, the bin edges and their float neighbours, NaN, ±inf."""
    span = high - low
    spread = torch.rand(300, generator=generator, dtype=torch.float64) * 1.5 * span + low - 0.25 * span
    edges = torch.linspace(low, high, bins + 1, dtype=dtype)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), low, high], dtype=dtype)
    return torch.cat(
        [spread.to(dtype), edges, torch.nextafter(edges, edges + 1), torch.nextafter(edges, edges - 1), special]
    )


CASES = [
    # bins, min, max, dtype, integer-valued input
    (4, 0, 3, torch.float32, True),  # OLMoE's call: histc(ids.float(), num_experts, 0, num_experts - 1)
    (64, 0, 63, torch.float32, True),
    (5, -2, 7, torch.float32, True),
    (1, 0, 1, torch.float32, False),
    (7, -1.3, 2.9, torch.float32, False),
    (10, 0.1, 0.7, torch.float32, False),
    (33, -1e3, 5e4, torch.float32, False),
    (13, -0.3, 8.2, torch.float64, False),
]


@pytest.mark.parametrize("bins, low, high, dtype, integral", CASES)
def test_equals_torch_histc_bit_for_bit(bins, low, high, dtype, integral):
    g = torch.Generator().manual_seed(bins)
    x = _hard_values(bins, low, high, dtype, g)
    if integral:
        x = x.nan_to_num(nan=0.0, posinf=high + 1, neginf=low - 1).round()
    x = x[torch.randperm(x.numel() // 2 * 2, generator=g)].reshape(-1, 2)  # histc flattens any shape
    ep, [record] = _decomposed(bins, low, high, x)
    assert record.outcome == "applied" and record.transform == "decompose_histc" and record.added > 0
    assert HISTC not in _targets(ep)
    for sample in (x, x.flip(0), torch.full_like(x, float(high)), torch.full_like(x, float("nan"))):
        want = torch.histc(sample, bins, low, high)
        got = ep.module()(sample)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want), (sample, got, want)


def test_many_random_ranges():
    g = torch.Generator().manual_seed(13)
    for i in range(40):
        bins = int(torch.randint(1, 50, (1,), generator=g))
        low = float(torch.randn(1, generator=g)) * 100
        high = low + float(torch.rand(1, generator=g)) * 50 + 1e-3
        x = _hard_values(bins, low, high, torch.float32, g)
        ep, [record] = _decomposed(bins, low, high, x)
        assert record.outcome == "applied"
        assert torch.equal(ep.module()(x), torch.histc(x, bins, low, high)), (bins, low, high)


def test_decomposed_program_passes_the_core_aten_verifier():
    from executorch.exir import EdgeCompileConfig, to_edge

    x = torch.tensor([0.0, 3.0, 1.0, 1.0, 2.0, 5.0])
    ep, _ = _decomposed(4, 0, 3, x)
    edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=True))  # raises for aten.histc
    assert torch.equal(edge.exported_program().module()(x), torch.histc(x, 4, 0, 3))


def test_min_equal_max_is_refused_and_left_for_executorch():
    from executorch.exir import to_edge

    x = torch.tensor([0.0, 3.0, 1.0, 1.0])
    ep, [record] = _decomposed(4, 0, 0, x)  # min == max: torch takes the range from the data
    assert record.outcome == "refused" and record.removed == 0 and record.added == 0
    assert "min == max" in record.detail
    assert HISTC in _targets(ep)
    with pytest.raises(Exception, match="histc"):
        to_edge(ep)


@pytest.mark.parametrize(
    "dtype, bins, low, high, reason",
    [
        (torch.float16, 4, 0, 3, "float16"),
        (torch.float32, 4, 3, 3, "min == max"),
        (torch.float32, 4, 0, float("inf"), "not finite"),
        (torch.float32, 4, 1.0, 1.0 + 1e-12, "empty"),  # distinct doubles, one float32
        (torch.float32, 4, -3e38, 3e38, "overflows"),
    ],
)
def test_refusals_name_their_reason(dtype, bins, low, high, reason):
    assert reason in histc_refusal(torch.zeros(8, dtype=dtype), bins, low, high)


def test_counts_a_float_cannot_hold_exactly_are_refused():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        big = torch.empty(2**24)
    assert "exact only below" in histc_refusal(big, 4, 0, 3)


def test_a_backend_that_keeps_histc_whole_keeps_it():
    x = torch.tensor([0.0, 3.0, 1.0])
    ep = torch.export.export(Histc(4, 0, 3), (x,))
    [record] = decompose_histc(ep, keep_whole=(HISTC,))
    assert record.outcome == "refused" and "keeps aten.histc whole" in record.detail
    assert HISTC in _targets(ep)


def test_transform_runs_the_decompositions_lower_runs(fixture_backends):
    """``edgeplug.transform`` is lower's export stage: its program passes to_edge's verifier."""
    import edgeplug
    from executorch.exir import to_edge

    x = torch.tensor([0.0, 3.0, 1.0, 1.0, 2.0, 5.0])
    ep = torch.export.export(Histc(4, 0, 3), (x,))
    out = edgeplug.transform(ep, fixture_backends.TABLE)
    assert HISTC in _targets(ep)  # the argument is left as it was
    assert HISTC not in _targets(out)
    assert torch.equal(to_edge(out).exported_program().module()(x), torch.histc(x, 4, 0, 3))


# -- OLMoE (transformers' MoE routing) --------------------------------------------------


@pytest.fixture(scope="module")
def olmoe(zoo):
    _model, ep, inputs, _norms = zoo.exported("olmoe", 1)
    assert HISTC in _targets(ep)
    return ep, inputs


def _lowered(olmoe, backend):
    import edgeplug

    ep, inputs = olmoe
    result = edgeplug.lower(copy.deepcopy(ep), inputs, backend, verify=True)
    [histc] = [t for t in result.report.transforms if t.transform == "decompose_histc"]
    assert histc.outcome == "applied"
    return result.report


@pytest.mark.slow
def test_olmoe_lowers_and_verifies(olmoe, fixture_backends):
    """On a backend verified on the host (every first-party backend lowers OLMoE in ``make zoo``)."""
    report = _lowered(olmoe, fixture_backends.FUSED)
    assert report.partitions
    assert report.verification.passed and report.verification.max_abs_diff <= 1e-4
    print(len(report.partitions), "partitions,", len(report.cpu_nodes), "CPU nodes:",
          dict(Counter((c.op, c.reason) for c in report.cpu_nodes)))


# -- the other export-stage decompositions OLMoE needs (edgeplug._graph.decompose) ---------


def _export_and(fn, module, inputs):
    ep = torch.export.export(module, inputs)
    records = fn(ep)
    ep.graph_module.recompile()
    return ep, records


def test_stable_sort_of_integer_keys():
    from edgeplug._graph.decompose import sort_as_ranks

    class Sort(torch.nn.Module):
        def forward(self, k):
            return torch.sort(k)

    k = torch.tensor([3, 1, 2, 1, 0, 3, 3, 2, 0, 1])
    ep, [record] = _export_and(sort_as_ranks, Sort(), (k,))
    assert record.outcome == "applied" and torch.ops.aten.sort.default not in _targets(ep)
    for keys in (k, k.flip(0), torch.randint(-5, 5, (10,), generator=torch.Generator().manual_seed(2))):
        values, indices = ep.module()(keys)
        want_values, want_indices = torch.sort(keys, stable=True)
        assert torch.equal(values, want_values) and torch.equal(indices, want_indices)
    floats, [refused] = _export_and(sort_as_ranks, Sort(), (torch.rand(6),))
    assert refused.outcome == "refused" and torch.ops.aten.sort.default in _targets(floats)


def test_grouped_mm_fallback_as_bmm():
    from transformers.integrations import moe  # registers transformers::grouped_mm_fallback

    from edgeplug._graph.decompose import grouped_mm_as_bmm

    class GroupedMM(torch.nn.Module):
        def forward(self, x, w, offs):
            return torch.ops.transformers.grouped_mm_fallback(x, w, offs)

    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(9, 5, generator=g), torch.randn(4, 5, 3, generator=g)
    offs = torch.tensor([2, 2, 5, 7], dtype=torch.int32)  # an empty group, 2 rows past the last offset
    ep, [record] = _export_and(grouped_mm_as_bmm, GroupedMM(), (x, w, offs))
    assert record.outcome == "applied" and moe is not None
    assert not any("grouped_mm" in str(t) for t in _targets(ep))
    for o in (offs, torch.tensor([0, 4, 4, 9], dtype=torch.int32)):
        got, want = ep.module()(x, w, o), torch.ops.transformers.grouped_mm_fallback(x, w, o)
        assert torch.allclose(got, want, atol=1e-6, rtol=0) and torch.equal(got[7:] == 0, want[7:] == 0)


def test_empty_like_becomes_empty_of_its_shape():
    from executorch.exir import to_edge

    from edgeplug._graph.decompose import empty_like_as_empty

    class InversePermutation(torch.nn.Module):  # transformers' MoE restores the token order so
        def forward(self, perm):
            inv = torch.empty_like(perm)
            inv[perm] = torch.arange(perm.shape[0])
            return inv

    perm = torch.tensor([2, 0, 3, 1])
    ep, [record] = _export_and(empty_like_as_empty, InversePermutation(), (perm,))
    assert record.outcome == "applied"
    # the new node's value lives in the program's fake mode: a later pass that traces it beside
    # the program's own values (fusion's re-trace did, on olmoe) must not meet two modes
    vals = [n.meta["val"] for n in ep.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    assert len({id(v.fake_mode) for v in vals}) == 1
    assert torch.equal(to_edge(ep).exported_program().module()(perm), torch.argsort(perm))  # empty_permuted refused


def test_export_decompositions_leave_what_the_backend_keeps_whole(fixture_backends):
    import dataclasses

    import edgeplug
    from edgeplug._graph import run_passes
    from edgeplug._graph.decompose import export_decompositions

    class SortAndCount(torch.nn.Module):
        def forward(self, k):
            values, _ = torch.sort(k)
            return torch.histc(values.float(), bins=4, min=0, max=3)

    k = torch.tensor([3, 1, 2, 1, 0])
    ep = torch.export.export(SortAndCount(), (k,))
    backend = dataclasses.replace(edgeplug.get_backend(fixture_backends.TABLE), keep_whole=(torch.ops.aten.sort.default,))
    passes = export_decompositions(ep, backend)
    assert [p.name for p in passes] == ["decompose_histc", "sort_as_ranks"]
    done = run_passes(ep, passes, backend=backend)
    ep = done.program
    assert {(r.transform, r.outcome) for r in done.records} == {("decompose_histc", "applied"), ("sort_as_ranks", "refused")}
    assert _targets(ep) & {HISTC, torch.ops.aten.sort.default} == {torch.ops.aten.sort.default}
    assert torch.equal(ep.module()(k), torch.histc(k.float(), 4, 0, 3))
    assert export_decompositions(torch.export.export(torch.nn.ReLU(), (k.float(),)), backend) == []
