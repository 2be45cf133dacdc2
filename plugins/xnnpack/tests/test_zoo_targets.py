"""The zoo's xnnpack target line (moved from the core's tests/test_zoo.py: the line is xnnpack's)."""

from __future__ import annotations


def test_xnnpack_target_counts_a_stock_failure_as_nothing_to_divide(zoo):
    def cell(model, ours, stock, stock_error=""):
        return zoo.Cell(
            model=model, backend="xnnpack", dry_run=False,
            edgeplug=zoo.Side(ok=True, partitions=ours[0], cpu_ops={"aten.embedding.default": ours[1]}),
            stock=zoo.Side(ok=not stock_error, error=stock_error, partitions=stock[0],
                           cpu_ops={"aten.embedding.default": stock[1]} if not stock_error else {}),
        )

    good = cell("llama", (2, 7), (9, 65))
    failed = cell("olmoe", (8, 60), (0, 0), stock_error="SpecViolationError: aten.histc")
    [line] = [t for t in zoo.targets([good, failed]) if t.startswith("xnnpack:")]
    assert line.endswith("— met") and "stock fails on olmoe" in line
    over = cell("bamba", (4, 13), (11, 70))  # 4 partitions > 11 / 3
    [line] = [t for t in zoo.targets([good, failed, over]) if t.startswith("xnnpack:")]
    assert line.endswith("— not met")
