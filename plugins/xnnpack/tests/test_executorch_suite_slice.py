"""CI's slice of ExecuTorch's backend test suite (issue 45): xnnpack float32 operator tests through edgeplug's flow
and stock's, in one process, the flows alternating test by test (``edgeplug.testing.executorch_suite``).

A test stock's flow passes must pass through edgeplug, or be refused up front with edgeplug's reason (an op outside
core ATen left on the CPU where no ExecuTorch kernel runs it); no case may fail in edgeplug's lowering where stock's
flow lowers. The slice is the adaptive max pools (the cases issue 45 found failing in edgeplug's lowering), the
other ops outside core ATen the suite holds (embedding_bag, median, round with decimals) and one test of common ops
of each kind; the whole suite is ``make executorch-suite`` (docs/benchmarks.md has its table). About a minute and a
half on two busy cores.
"""

from __future__ import annotations

import pytest

# slow: the slice runs each test through both flows (minutes on 2 cores): make test-slow runs it, as CI does
pytestmark = pytest.mark.slow

pytest.importorskip("executorch.backends.test.suite")

SLICE = (
    # the adaptive max pools: 1d and 2d stay on the CPU without a kernel (refused up front, as the suite skips them
    # for stock), 3d too (stock "passes" it with nothing delegated and nothing run; its .pte does not load)
    "test_adaptive_maxpool1d_dtype", "test_adaptive_maxpool2d_dtype", "test_adaptive_maxpool2d_return_indices",
    "test_adaptive_maxpool3d_dtype", "test_adaptive_maxpool3d_return_indices",
    # the suite's other ops outside core ATen
    "test_embedding_bag_dtype", "test_median_dtype", "test_round_decimals",
    # common ops, one test each
    "test_adaptive_avgpool3d_dtype", "test_add_dtype", "test_multiply_f32_bcast_first", "test_linear_dtype",
    "test_conv2d_dtype", "test_maxpool2d_dtype", "test_upsample_bilinear2d_dtype", "test_index_put_dtype",
    "test_masked_fill_dtype", "test_cat_dtype", "test_permute_dtype", "test_mean_dtype", "test_gelu_dtype",
    "test_embedding_dtype", "test_argmax_dtype",
)


@pytest.fixture(scope="module")
def run():
    from edgeplug.testing.executorch_suite import run_operator_tests

    return run_operator_tests("xnnpack", tests=SLICE)


def _row(run, test):
    [row] = [r for r in run.rows if r.test == test]
    return row


@pytest.mark.parametrize("test", SLICE)
def test_what_stock_passes_passes_through_edgeplug_or_is_refused_up_front(run, test):
    row = _row(run, test)
    stock, ours = row.flows["stock"], row.flows["edgeplug"]
    if stock.outcome == "passed":
        assert ours.outcome in ("passed", "refused"), f"stock passes {test}, edgeplug: {ours.outcome} {ours.cases[-1:]}"
    if stock.outcome != "failed":  # never a lowering error of ours where stock's flow lowers
        assert ours.outcome != "failed", f"{test}: {ours.cases[-1:]}"
    if ours.outcome == "refused":  # a reason the user can act on: the op, and what to do
        kind, detail = ours.cases[-1]
        assert kind == "refused" and "outside core ATen" in detail and "Fix:" in detail, detail


def test_the_slice_delegates_and_runs_what_it_delegates(run):
    """The slice is not vacuous: edgeplug delegates cases, which ExecuTorch's runtime ran and compared with eager,
    and the adaptive max pools are refused up front, naming the op."""
    delegated = [r.test for r in run.rows if any(k == "delegated" for k, _ in r.flows["edgeplug"].cases)]
    assert len(delegated) >= 8, run.table()  # 9 on executorch 1.5.1 (add, cat, conv2d, gelu, masked_fill, ...)
    for test in ("test_adaptive_maxpool2d_dtype", "test_adaptive_maxpool3d_dtype"):
        row = _row(run, test)
        assert row.flows["edgeplug"].outcome == "refused" and "adaptive_max_pool" in row.flows["edgeplug"].cases[-1][1]
    assert not run.lost()
    assert not run.lower_only and run.runtime == "ExecuTorch's Python runtime", (run.runtime, run.notes)
