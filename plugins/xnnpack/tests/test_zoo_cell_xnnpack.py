"""A real zoo cell on xnnpack (moved from the core's tests/test_zoo.py, which runs the zoo on fixture backends).

The one-layer Llama lowered by edgeplug and by stock executorch with the same XNNPACK partitioner, both .pte
files run in executorch's runtime: issue 13's xnnpack target on a decoder (at most a third of stock's graph
breaks, no norm op left on the CPU), every norm recorded (xnnpack has no fusion policy), numbers within 1e-4
of eager on both sides.
"""

from __future__ import annotations

import pytest

import edgeplug

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def cell(zoo):
    if "xnnpack" not in edgeplug.backends():
        pytest.skip("backend 'xnnpack' is not installed")
    return zoo.run_cell("llama", "xnnpack", layers=1, warm=False)


def test_a_llama_cell_breaks_the_graph_a_third_as_often_as_stock(zoo, cell):
    table = zoo.render_page([cell], "edgeplug zoo (test)", 1, 0.0)
    assert not cell.error, table
    e, s = cell.edgeplug, cell.stock
    assert e.ok and s.ok, table  # stock lowers it: a stock failure here is news
    assert cell.norms_present == 3 and cell.no_policy and cell.fusion_outcomes == {}, table
    assert e.verify_error == "" and e.max_abs_diff is not None and e.max_abs_diff <= 1e-4, table
    assert e.verify_passed in (True, None), table
    assert 3 * e.partitions <= s.partitions and 3 * e.cpu_nodes <= s.cpu_nodes, table
    assert not set(e.cpu_ops) & {"aten.mean.dim", "aten.rsqrt.default", "aten.pow.Tensor_Scalar"}, table
    assert e.seconds > 0 and s.seconds > 0


def test_stock_runs_in_executorchs_runtime_and_matches_eager(cell):
    assert cell.stock.ok and cell.stock.verify_method == "pte"
    assert cell.stock.max_abs_diff is not None and cell.stock.max_abs_diff <= 1e-4
