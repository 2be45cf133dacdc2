"""The zoo's quantized cells (issue 22): each scheme beside stock executorch's flow for the same quantizer.

One real cell (a 1-layer Llama, XNNPACK 8da4w: torchao's ``quantize_`` then stock
``to_edge_transform_and_lower``) runs both .pte files in executorch's runtime; the rest checks what
the zoo makes of cells: stock's failing stage, the plan of ``SCHEME@OWNER`` cells, the quantized
section of docs/zoo.md and how a later run replaces it.
"""

from __future__ import annotations

import pytest

import edgeplug
from edgeplug._errors import EdgeplugError
from edgeplug._zoo import Cell, Side, plan, run_cell
from edgeplug._zoo._render import QUANTIZED_BEGIN, QUANTIZED_END, quantized_targets, render_quantized, splice_quantized


@pytest.fixture(scope="module")
def cell_8da4w():
    return run_cell("llama", "xnnpack", "8da4w", layers=1, compare_stock=True, warm=False)


@pytest.mark.slow  # both sides quantize and lower a decoder (about 1 to 3 minutes on 2 shared cores)
def test_a_quantized_cell_lowers_both_sides_and_runs_both_ptes(cell_8da4w):
    c = cell_8da4w
    assert not c.error and not c.stock_absent
    e, s = c.edgeplug, c.stock
    assert e.ok and s.ok, (e.error, s.error)
    # the same quantizer on both sides: both .pte files are near the float model, and near each other
    assert 0.98 <= e.cosine_to_float < 1.0 and 0.98 <= s.cosine_to_float < 1.0
    assert abs(e.cosine_to_float - s.cosine_to_float) < 0.005
    assert abs(e.quantized_cosine - e.cosine_to_float) < 1e-3  # the quantized model's own, before lowering
    assert 0 < e.max_abs_float < 0.5 and 0 < s.max_abs_float < 0.5
    # edgeplug's program: fewer graph breaks, no larger, and both were timed in executorch's runtime
    assert e.partitions < s.partitions and e.cpu_nodes < s.cpu_nodes
    assert e.pte_bytes and s.pte_bytes and c.size_ratio == e.pte_bytes / s.pte_bytes <= 1.05
    assert e.latency_ms > 0 and s.latency_ms > 0 and c.latency_ratio == e.latency_ms / s.latency_ms
    assert e.verify_passed is True, e.verify_problems


def test_stocks_pt2e_flow_fails_at_calibration_and_says_so():
    """transformers' mask (an index chain) breaks after prepare_pt2e in stock's flow; edgeplug folds it first."""
    from edgeplug._zoo._stock_quantize import StageError, quantize_stock
    from edgeplug._zoo._models import exported_call

    module, _, args, kwargs, _ = exported_call("llama", 1)
    record = next(r for r in edgeplug.get_backend("xnnpack").records(edgeplug.QuantScheme) if r.scheme == "8a8w")
    with pytest.raises(StageError) as info:
        quantize_stock(module, args, kwargs, record)
    assert info.value.stage == "calibrate" and "IndexError" in str(info.value)


def test_scheme_at_owner_makes_cells_only_where_the_backend_has_no_such_scheme():
    cells, _ = plan(["llama"], ["xnnpack", "vulkan"], ["8da4w@xnnpack", "8da4w"])
    assert ("llama", "vulkan", "8da4w@xnnpack") in cells and ("llama", "xnnpack", "8da4w") in cells
    assert ("llama", "xnnpack", "8da4w@xnnpack") not in cells  # the owner lowers its own scheme as 8da4w
    with pytest.raises(EdgeplugError, match=r"backend 'xnnpack' declares no scheme 'w9'"):
        plan(["llama"], ["vulkan"], ["w9@xnnpack"])
    with pytest.raises(EdgeplugError, match=r"backend 'nope' declares no scheme"):
        plan(["llama"], ["vulkan"], ["8da4w@nope"])


def test_the_quantized_section_names_stocks_failing_stage_and_the_targets():
    """Cells as a run records them (the figures of a 1-layer run): what the section and the targets make of them."""
    both = Cell(model="llama", backend="xnnpack", scheme="8da4w",
                edgeplug=Side(ok=True, partitions=2, cpu_ops={"aten.embedding.default": 1}, cosine_to_float=0.994,
                              max_abs_float=0.065, pte_bytes=80128, latency_ms=0.033),
                stock=Side(ok=True, partitions=9, cpu_ops={"aten.index.Tensor": 4}, cosine_to_float=0.994,
                           max_abs_float=0.065, pte_bytes=94848, latency_ms=0.053))
    failing = Cell(model="llama", backend="xnnpack", scheme="8a8w", edgeplug=Side(ok=True, partitions=2),
                   stock=Side(error="IndexError: tensors used as indices must be long", stage="calibrate"))
    low = Cell(model="gemma3", backend="xnnpack", scheme="8da4w",
               edgeplug=Side(ok=True, partitions=2, cosine_to_float=0.95, quantized_cosine=0.951),
               stock=Side(ok=True, partitions=9, cosine_to_float=0.952))
    tried = Cell(model="llama", backend="vulkan", scheme="8da4w@xnnpack",
                 edgeplug=Side(error="LoweringError: in executorch's pass FusePatternsPass", stage="lower"),
                 stock=Side(ok=True, partitions=3))
    # a borrowed scheme tried on several models is one line, not one per model
    on_qnn = [Cell(model=m, backend="qnn", scheme="8da4w@xnnpack", dry_run=True,
                   edgeplug=Side(error="LoweringError: Missing out variants", stage="lower"),
                   stock_absent="its SDK is absent here") for m in ("llama", "qwen3")]
    cells = [both, failing, low, tried, *on_qnn]
    text = render_quantized(cells, "edgeplug zoo --schemes 8a8w,8da4w", 1, 60.0, layers=1)
    assert text.startswith(QUANTIZED_BEGIN) and text.rstrip().endswith(QUANTIZED_END)
    assert "**fails** at calibrate: IndexError" in text
    lines = quantized_targets(cells)
    assert any(row.startswith("stock fails on 1 at calibrate (llama xnnpack 8a8w)") for row in lines)
    cos = next(row for row in lines if row.startswith("8da4w cosine"))
    assert "on 1 of 2" in cos and cos.endswith("not met")
    # a cell below its target says what the scheme alone costs and what stock's .pte gives
    assert "gemma3 xnnpack 8da4w 0.9500 (the quantized model itself, before lowering: 0.9510; stock's .pte: 0.9520)" in cos
    assert "| gemma3 | xnnpack | 8da4w | lowers | lowers | 2 / 0 vs 9 / 0 | 0.9500 / 0.9520; 0.9510 |" in text
    assert any(row.startswith(".pte size ≤ 1.05× stock's on 1 of 1") and row.endswith("— met") for row in lines)
    assert any(row.startswith(".pte latency ≤ 0.85× stock's on 1 of 1") for row in lines)
    # a scheme the backend does not offer is named with both sides' outcome, not counted as a failure
    assert lines[0].startswith("every cell of a scheme its backend offers lowers with edgeplug: 3 of 3")
    assert any(row.startswith("vulkan does not offer xnnpack's 8da4w; tried on llama: edgeplug fails at lower") and
               row.endswith("stock lowers") for row in lines)
    [qnn] = [row for row in lines if row.startswith("qnn does not offer")]
    assert qnn == ("qnn does not offer xnnpack's 8da4w; tried on llama, qwen3: edgeplug fails at lower "
                   "(LoweringError: Missing out variants) on all 2, stock its SDK is absent here")
    assert "| llama | xnnpack | 8da4w | lowers | lowers | 2 / 1 vs 9 / 4 | 0.9940 / 0.9940 |" in text
    assert "| 78.2 vs 92.6 (0.84×) | 0.0330 (0.62×) |" in text


def test_a_later_quantized_run_replaces_the_section_and_keeps_the_page():
    page = "# zoo\n\nfloat tables\n"
    first = splice_quantized(page, f"{QUANTIZED_BEGIN}\nfirst run\n{QUANTIZED_END}\n")
    assert first.startswith(page.rstrip("\n")) and "first run" in first
    second = splice_quantized(first + "\ntrailing notes\n", f"{QUANTIZED_BEGIN}\nsecond run\n{QUANTIZED_END}\n")
    assert "second run" in second and "first run" not in second
    assert second.count(QUANTIZED_BEGIN) == 1 and "float tables" in second and "trailing notes" in second
