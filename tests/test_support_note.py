"""``BackendSpec.support_note``: a backend whose support depends on the machine (which runtime's op list decides)
says so in each lowering's report, from the partitioner that lowering made, and in ``edgeplug backends``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import edgeplug


class AddMul(torch.nn.Module):
    def forward(self, x):
        return (x + 1) * x


def _with_note(backend, note):
    return dataclasses.replace(backend, spec=backend.spec.model_copy(update={"support_note": note}))


def test_the_report_carries_the_note_given_the_lowerings_partitioner(fixture_backends):
    made = []
    base = edgeplug.get_backend(fixture_backends.TABLE)
    original = base.spec.partitioner

    def partitioner():
        made.append(original())
        return made[-1]

    seen = []

    def note(partitioner):
        seen.append(partitioner)
        return "decided by the list this partitioner was made with"

    backend = dataclasses.replace(base, spec=base.spec.model_copy(update={"partitioner": partitioner}))
    report = edgeplug.lower(AddMul(), (torch.randn(2, 4),), _with_note(backend, note), dry_run=True).report
    assert "decided by the list this partitioner was made with" in report.notes
    assert len(made) == 1 and seen == made  # one decision per lowering, read back from its own partitioner
    plain = edgeplug.lower(AddMul(), (torch.randn(2, 4),), base, dry_run=True).report
    assert "decided by the list this partitioner was made with" not in plain.notes


def test_a_note_that_raises_is_the_plugins_fault_named(fixture_backends):
    def note(partitioner):
        raise KeyError("no list")

    backend = _with_note(edgeplug.get_backend(fixture_backends.TABLE), note)
    with pytest.raises(edgeplug.LoweringError, match=r"BackendSpec.support_note, from .* raised KeyError"):
        edgeplug.lower(AddMul(), (torch.randn(2, 4),), backend, dry_run=True)
