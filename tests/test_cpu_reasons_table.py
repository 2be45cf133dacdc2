"""The report's table gives each reason an op stays on the CPU a line of its own, with its node count.

Before, every reason for one op was joined into one line ("r1; r2; r3 ..."), which ran to hundreds of columns
when a backend's filters refused the nodes of one op for several reasons.
"""

from __future__ import annotations

from edgeplug import LoweringReport
from edgeplug._report.records import CpuNode


def _report(reasons: list[str]) -> LoweringReport:
    nodes = [CpuNode(node=f"div_{i}", op="aten.div.Tensor", reason=r) for i, r in enumerate(reasons)]
    return LoweringReport(model="m", backend="b", distribution="d", cpu_ops={"aten.div.Tensor": len(nodes)}, cpu_nodes=nodes)


def test_each_reason_of_one_op_is_a_line_with_its_count():
    long_a = "refused by filter 'no-div': this NPU has no divide, and its emulation by reciprocal and mul loses precision"
    long_b = "the partitioner's own check: int64 operands are not supported by this NPU's arithmetic units"
    table = _report([long_a, long_b, long_a]).to_table().splitlines()
    start = table.index(next(line for line in table if "aten.div.Tensor" in line))
    assert table[start].split() == ["aten.div.Tensor", "x3", "2", "reasons:"]
    assert table[start + 1].split(None, 1) == ["x2", long_a]
    assert table[start + 2].split(None, 1) == ["x1", long_b]
    assert all(len(line) < 140 for line in table[start:start + 3])


def test_one_reason_stays_on_the_ops_line():
    table = _report(["no divide here", "no divide here"]).to_table()
    assert any(line.split() == ["aten.div.Tensor", "x2", "no", "divide", "here"] for line in table.splitlines()), table
