"""By default no delegate is handed a weight as a runtime input: a constant several partitions read (a tied
embedding table and ``lm_head``) is copied into each, as stock ExecuTorch does.

Before, a backend had to know to set ``BackendSpec.copy_shared_constants=True`` (the guide named it for one GPU
only): otherwise the tied weight reached each delegate as an input, which a delegate building weights from constant
data refuses in its preprocess ("unsupported param type"), while stock ExecuTorch lowered the same model.
``copy_shared_constants=False`` keeps the one input, for a runtime that takes shared weights.
"""

from __future__ import annotations

import types

import pytest
import torch

import edgeplug
import edgeplug_fixture_backends as fb  # tests/fixtures/backends (put on the path by conftest)
from edgeplug.plugin import BackendSpec, hookimpl

NAME = "fixture-tied"


class TiedHead(torch.nn.Module):
    """An embedding whose table is also the output projection, a CPU op (logical_not) between the two."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(32, 16)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens)
        h = h * (h > 0).logical_not()
        return h @ self.emb.weight.t()


def _lower(edgeplug_register, **fields):
    @hookimpl
    def edgeplug_backends():
        yield BackendSpec(**{"backend": NAME, "description": "tied weights (an edgeplug test backend)",
                             "backend_id": fb.BACKEND_IDS[fb.TABLE], "partitioner": fb.table_partitioner, **fields})

    edgeplug_register(types.SimpleNamespace(edgeplug_backends=edgeplug_backends), name=f"tied-{sorted(fields)}")
    torch.manual_seed(0)
    return edgeplug.lower(TiedHead().eval(), (torch.tensor([[1, 5, 7]]),), NAME)


def _weights_handed_to_delegates(result) -> list[str]:
    """Parameters of the lowered program passed to a delegate call as inputs."""
    ep = result.edge.exported_program()
    params = set(ep.graph_signature.inputs_to_parameters)
    return [
        a.name for n in ep.graph.nodes if n.op == "call_function" and "executorch_call_delegate" in str(n.target)
        for a in n.args if isinstance(a, torch.fx.Node) and a.name in params
    ]


def test_a_weight_two_partitions_read_is_copied_into_each_by_default(edgeplug_register):
    result = _lower(edgeplug_register)
    assert len(result.report.partitions) == 2, result.report.to_table()
    assert _weights_handed_to_delegates(result) == []
    copies = [t for t in result.report.transforms if t.transform == "copy_shared_constants"]
    assert len(copies) == 1 and "stock ExecuTorch copies it" in copies[0].detail, result.report.transforms


def test_a_backend_whose_runtime_takes_shared_weights_keeps_the_one_input(edgeplug_register):
    result = _lower(edgeplug_register, copy_shared_constants=False)
    assert len(result.report.partitions) == 2, result.report.to_table()
    assert len(_weights_handed_to_delegates(result)) == 2
    assert not [t for t in result.report.transforms if t.transform == "copy_shared_constants"]


class RaisingPartitioner:
    """A backend's partitioner that raises on the program (its own bug, or a program it cannot take)."""

    def __init__(self) -> None:
        self.inner = fb.table_partitioner()

    def ops_to_not_decompose(self, ep):
        return [], None

    def partition(self, exported_program):
        raise ValueError("RaisingPartitioner cannot partition a program with an embedding")  # the line named


def test_the_backends_partitioner_raising_in_the_trial_partition_is_the_backends_fault(edgeplug_register):
    """The copy needs a trial partition before the real one: an error the backend's partitioner raises there is
    named as the backend's (its plugin, file and line), not as a bug of the core pass that ran it."""
    with pytest.raises(edgeplug.LoweringError) as err:
        _lower(edgeplug_register, partitioner=RaisingPartitioner)
    message = str(err.value)
    assert "RaisingPartitioner cannot partition a program with an embedding" in message
    assert f"{__file__}:" in message and "in plugin " in message, message
    assert "BackendSpec.copy_shared_constants" in message
    assert "of the edgeplug core" not in message and "bug in edgeplug" not in message, message
