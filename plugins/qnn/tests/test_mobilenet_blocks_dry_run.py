"""The SDK-free support tables of qnn cover every op of MobileNet's building blocks (convolution, batch norm,
hardtanh, relu, hardswish, hardsigmoid, mean, linear, add, mul, view): the real partitioner leaves nothing
on the CPU, and neither may the dry run's tables (moved from the core's tests/test_et_examples.py, issue 23;
the blocks are edgeplug.testing.programs.mobilenet_blocks).
"""

from __future__ import annotations

import pytest

import edgeplug
from edgeplug.testing.programs import mobilenet_blocks

BACKEND = "qnn"


@pytest.mark.slow
@pytest.mark.parametrize("version", ["v2", "v3"])
def test_the_dry_run_tables_delegate_every_op_of_the_mobilenet_blocks(version):
    model, inputs = mobilenet_blocks(version)
    report = edgeplug.lower(model, inputs, BACKEND, dry_run=True, model_name=f"mobilenet_{version}-blocks").report
    assert report.dry_run and report.partitions, report.to_table()
    assert report.cpu_node_count == 0, report.to_table()
