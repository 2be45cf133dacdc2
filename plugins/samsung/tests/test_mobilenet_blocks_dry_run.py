"""The SDK-free support tables of samsung cover every op of MobileNet's building blocks (convolution, batch norm,
hardtanh, relu, hardswish, hardsigmoid, mean, linear, add, mul, view): the real partitioner leaves nothing
on the CPU, and neither may the dry run's tables (moved from the core's tests/test_et_examples.py, issue 23;
the blocks are built by that module, loaded from its file).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import edgeplug

BACKEND = "samsung"


def _et_examples():
    tests = Path(__file__).resolve().parents[3] / "tests"
    if str(tests / "fixtures" / "backends") not in sys.path:  # the module lists the fixture backends' cases
        sys.path.insert(0, str(tests / "fixtures" / "backends"))
    path = tests / "test_et_examples.py"
    spec = importlib.util.spec_from_file_location("_core_et_examples", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("example", ["mobilenet_v2-blocks", "mobilenet_v3-blocks"])
def test_the_dry_run_tables_delegate_every_op_of_the_mobilenet_blocks(example):
    model, inputs = _et_examples().build_example(example, torch.float32)
    report = edgeplug.lower(model, inputs, BACKEND, dry_run=True, model_name=example).report
    assert report.dry_run and report.partitions, report.to_table()
    assert report.cpu_node_count == 0, report.to_table()
