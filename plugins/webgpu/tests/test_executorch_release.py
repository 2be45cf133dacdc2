"""WebGPU's partitioner is new in ExecuTorch 1.5: on a release without it the backend is refused before any
work, dry runs included, naming the release that has it; on one with it, the backend is available (issue 43).
CI runs this file on both releases (``make test`` and ``make test EXECUTORCH=1.4.1``)."""

from __future__ import annotations

import pytest
import torch

import edgeplug
from edgeplug.plugin import executorch_has

HAS_PARTITIONER = executorch_has("executorch.backends.webgpu.partitioner", "WebGPUPartitioner")


def test_webgpu_is_available_exactly_where_the_release_has_its_partitioner():
    a = edgeplug.get_backend("webgpu").availability()
    assert a.ok is HAS_PARTITIONER and a.dry_run is HAS_PARTITIONER
    if not HAS_PARTITIONER:
        assert "lacks WebGPUPartitioner" in a.reason and "ExecuTorch 1.5 and later" in a.reason


@pytest.mark.skipif(HAS_PARTITIONER, reason="this release has WebGPUPartitioner (the refusal is checked on 1.4.x)")
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_release_without_the_partitioner_refuses_before_any_work(dry_run):
    with pytest.raises(edgeplug.BackendUnavailableError, match="ExecuTorch 1.5 and later") as err:
        edgeplug.lower(torch.nn.Linear(4, 4), (torch.randn(1, 4),), backend="webgpu", dry_run=dry_run)
    assert "--dry-run" not in str(err.value)
