"""Hostile inputs on xnnpack (issue 28): forty constant ramps over the folding budget still give a .pte
within twice stock executorch's size.

Moved from the core's tests/test_hostile_inputs.py (issue 23).
"""

from __future__ import annotations

import pytest
import torch

import edgeplug


class Ramps(torch.nn.Module):
    """``layers`` layers that each add ``arange(n) * k``: constant-only, and large together."""

    def __init__(self, layers: int, n: int) -> None:
        super().__init__()
        self.layers, self.n = layers, n

    def forward(self, x):
        for k in range(self.layers):
            x = x + torch.arange(self.n, dtype=torch.float32) * float(k + 2)
        return x


@pytest.mark.slow
def test_forty_ramps_write_a_pte_within_twice_stocks_size():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    model, x = Ramps(40, 512 * 512), (torch.randn(512 * 512),)
    stock = to_edge_transform_and_lower(torch.export.export(model, x), partitioner=[XnnpackPartitioner()])
    stock_bytes = len(stock.to_executorch().buffer)
    result = edgeplug.lower(model, x, "xnnpack")
    assert len(result.buffer) <= 2 * stock_bytes
    assert sum(1 for t in result.report.transforms if t.transform == "constant_fold" and t.outcome == "refused") == 80
