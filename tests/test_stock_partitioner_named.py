"""``--compare-stock`` with a backend whose partitioner subclasses ExecuTorch's: it names the stock partitioner
(``BackendSpec.stock_partitioner``) and the comparison runs with that one; without the field there is no stock flow
and the report says how to name one. Before, the comparison silently turned off once an author subclassed the
partitioner (stock meant "a class under ``executorch.``") and nothing could name the stock class.
"""

from __future__ import annotations

import types

import torch

import edgeplug
import edgeplug_fixture_backends as fb  # tests/fixtures/backends (put on the path by conftest)
from edgeplug.plugin import BackendSpec, hookimpl

NAME = "fixture-subclassed"


def _own_partitioner():
    """The author's subclass of executorch's demo partitioner (adds and matmuls): its module is not executorch's."""
    from executorch.exir.backend.test.op_partitioner_demo import AddMulPartitionerDemo

    class MyAddMulPartitioner(AddMulPartitionerDemo):
        pass

    return MyAddMulPartitioner()


class AddMatmul(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x @ y + x


def _stock(edgeplug_register, **fields):
    """What ``--compare-stock`` adds to the report (``edgeplug._stock.stock_partitioning``), for the subclassing backend."""
    from edgeplug._stock import stock_partitioning

    @hookimpl
    def edgeplug_backends():
        yield BackendSpec(**{"backend": NAME, "description": "a subclassed partitioner (an edgeplug test backend)",
                             "backend_id": "BackendWithCompilerDemo", "partitioner": _own_partitioner, **fields})

    edgeplug_register(types.SimpleNamespace(edgeplug_backends=edgeplug_backends), name=f"subclassed-{sorted(fields)}")
    return stock_partitioning(AddMatmul(), (torch.randn(4, 4), torch.randn(4, 4)), edgeplug.get_backend(NAME))


def test_a_named_stock_partitioner_is_compared_with(edgeplug_register):
    stock = _stock(edgeplug_register, stock_partitioner=fb.stock_partitioner)
    assert not stock.error, stock.error
    assert "AddMulPartitionerDemo()" in stock.flow and stock.partitions and stock.delegated_ops, stock


def test_without_one_the_report_says_how_to_name_it(edgeplug_register):
    stock = _stock(edgeplug_register)
    assert "MyAddMulPartitioner, not an executorch partitioner: no stock flow" in stock.error
    assert "BackendSpec.stock_partitioner" in stock.error and not stock.partitions
