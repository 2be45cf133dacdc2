"""The zoo on vulkan (moved from the core's tests/test_zoo.py, which runs the zoo on fixture backends).

The target line issue 13 set for vulkan (an op with no kernel may stay on the CPU and split the graph; nothing
else may), and a real cell: the one-layer Llama in one partition with nothing on the CPU, verified on host
kernels against eager and against stock executorch's lowering. The cell (about 40 s) runs with
``EDGEPLUG_ZOO=1`` (``make zoo``).
"""

from __future__ import annotations

import os

import pytest

import edgeplug


@pytest.fixture(scope="module")
def zoo():
    import edgeplug._zoo

    return edgeplug._zoo


def _vulkan_cell(zoo, model, partitions, reasons):
    side = zoo.Side(ok=True, partitions=partitions, cpu_ops={op: 1 for op in reasons},
                    cpu_reasons={op: [why] for op, why in reasons.items()})
    return zoo.Cell(model=model, backend="vulkan", dry_run=False, edgeplug=side)


def test_vulkan_target_allows_only_splits_at_ops_without_a_kernel(zoo):
    """Issue 13's Vulkan line: an op with no kernel may stay (and split the graph); nothing else may."""
    no_kernel = "Vulkan: no operator implementation"
    met = [
        _vulkan_cell(zoo, "llama", 1, {}),
        _vulkan_cell(zoo, "falcon-mamba", 2, {"aten.log1p.default": no_kernel}),
    ]
    [line] = [t for t in zoo.targets(met) if t.startswith("vulkan:")]
    assert line.endswith("— met") and "falcon-mamba 2 (log1p.default)" in line

    high_dim = _vulkan_cell(zoo, "bamba", 4, {"aten.cumsum.default": no_kernel,
                                              "aten.exp.default": "Vulkan: op does not support high dim tensors"})
    two_without_cause = _vulkan_cell(zoo, "qwen3", 2, {})  # split with nothing kernel-less on the CPU
    for bad in (high_dim, two_without_cause):
        [line] = [t for t in zoo.targets([*met, bad]) if t.startswith("vulkan:")]
        assert line.endswith("— not met"), line
    [line] = [t for t in zoo.targets([*met, high_dim]) if t.startswith("vulkan:")]
    assert "bamba: exp.default" in line


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("EDGEPLUG_ZOO") != "1", reason="runs with EDGEPLUG_ZOO=1 (`make zoo`)")
def test_a_llama_cell_is_one_partition_with_nothing_on_the_cpu(zoo):
    pytest.importorskip("transformers")
    if "vulkan" not in edgeplug.backends():
        pytest.skip("backend 'vulkan' is not installed")
    cell = zoo.run_cell("llama", "vulkan", layers=1, warm=False)
    table = zoo.render_page([cell], "edgeplug zoo (test)", 1, 0.0)
    assert not cell.error, table
    e, s = cell.edgeplug, cell.stock
    assert e.ok and s.ok, table  # stock lowers it: a stock failure here is news
    assert cell.norms_present == 3 and cell.norms_recorded == 3, table  # 2 per layer + final
    assert all(reason for _, reason in cell.rejected), table
    assert e.verify_error == "" and e.max_abs_diff is not None and e.max_abs_diff <= 1e-4, table
    assert (e.partitions, e.cpu_nodes) == (1, 0), table  # the whole decoder in one partition
    assert e.partitions <= s.partitions and e.cpu_nodes <= s.cpu_nodes, table
