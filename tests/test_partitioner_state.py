"""CorePartitioner is one lowering's: its answers depend on the program asked about, what it decided is set
once and read-only, and it configures no logging. Runs on the fixture backend that keeps rms_norm whole."""

from __future__ import annotations

import logging

import pytest
import torch
from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

import edgeplug
from edgeplug._partition import CorePartitioner


class TwoNorms(torch.nn.Module):
    """An rms_norm the backend takes (float32) and one it refuses (float64): one kept whole, one decomposed."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(8) + 0.5)
        self.w64 = torch.nn.Parameter(torch.rand(8, dtype=torch.float64) + 0.5)

    def forward(self, x, y):
        return torch.nn.functional.rms_norm(x, (8,), self.w, 1e-6) * 2, torch.nn.functional.rms_norm(y, (8,), self.w64, 1e-6)


def _program():
    return torch.export.export(TwoNorms(), (torch.randn(2, 8), torch.randn(2, 8, dtype=torch.float64)))


def _norms(ep):
    return sorted(n.name for n in ep.graph.nodes if n.target == torch.ops.aten.rms_norm.default)


@pytest.fixture
def keep(fixture_backends):
    return edgeplug.get_backend(fixture_backends.KEEP)


def test_answers_depend_on_the_program_not_on_what_ran_before(keep):
    ep = _program()
    part = CorePartitioner(keep, dry_run=True)
    ops, check = part.ops_to_not_decompose(ep)
    assert torch.ops.aten.rms_norm.default in ops
    f32, f64 = _norms(ep)
    nodes = {n.name: n for n in ep.graph.nodes}
    before = {name: check(nodes[name]) for name in (f32, f64)}
    assert before == {f32: True, f64: False}
    assert dict(part.decomposed) == {f64: ("aten.rms_norm.default", part.keep_decisions[f64].reason)}
    assert "float64" in part.keep_decisions[f64].reason

    to_edge_transform_and_lower(_program(), partitioner=[part], compile_config=EdgeCompileConfig(_check_ir_validity=False))
    assert part.outcome is not None and part.partitions

    # asked about the same aten program after partitioning, it answers as before (it once switched to
    # executorch's after-lowering check as soon as an outcome was set)
    ops_after, check_after = part.ops_to_not_decompose(ep)
    assert ops_after == ops
    assert {name: check_after(nodes[name]) for name in (f32, f64)} == before


def test_what_it_decided_is_set_once_and_read_only(keep):
    part = CorePartitioner(keep, dry_run=True)
    assert part.outcome is None and part.partitions == [] and dict(part.keep_decisions) == {}
    edge = to_edge_transform_and_lower(
        _program(), partitioner=[part], compile_config=EdgeCompileConfig(_check_ir_validity=False)
    )
    outcome = part.outcome
    with pytest.raises(TypeError):
        part.keep_decisions["x"] = True  # type: ignore[index]
    with pytest.raises(TypeError):
        part.decomposed["x"] = ("op", "why")  # type: ignore[index]
    with pytest.raises(AttributeError):
        part.outcome = None  # type: ignore[misc]
    with pytest.raises(edgeplug.LoweringError, match=r"already partitioned a program; make a new one for each lowering"):
        part.partition(edge.exported_program())
    assert part.outcome is outcome  # the refused second call changed nothing


def test_the_partitioner_configures_no_logging(keep, monkeypatch):
    root = logging.getLogger()
    calls = []
    real = logging.Logger.setLevel

    def spy(self, level):
        if self is root:
            calls.append(level)
        return real(self, level)

    monkeypatch.setattr(logging.Logger, "setLevel", spy)
    handlers = list(root.handlers)
    part = CorePartitioner(keep, dry_run=True)
    to_edge_transform_and_lower(_program(), partitioner=[part], compile_config=EdgeCompileConfig(_check_ir_validity=False))
    assert calls == [] and root.handlers == handlers
