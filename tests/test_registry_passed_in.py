"""The registry is passed in: a PluginManager is an ordinary object, and the process's default one (what
``edgeplug.get_backend`` and ``edgeplug.backends`` read) is only the façade's."""

from __future__ import annotations

import pytest
import torch
from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

import edgeplug
from edgeplug._backend import backend_names
from edgeplug._partition import CorePartitioner
from edgeplug._registry import PluginManager


@pytest.fixture
def own_registry(monkeypatch):
    import edgeplug_fixture_backends as fb

    monkeypatch.setenv("EDGEPLUG_PLUGINS", "no-entry-point-plugin")  # entry points: none; registered: ours
    m = PluginManager()
    m.register(fb, "fixture-backends-own")
    return m, fb


def test_a_registry_of_its_own_resolves_backends_the_default_does_not_know(own_registry):
    m, fb = own_registry
    assert backend_names(m) == sorted(fb.ALL)
    assert fb.KEEP not in edgeplug.backends()
    with pytest.raises(edgeplug.UnknownBackendError, match=fb.KEEP):
        edgeplug.get_backend(fb.KEEP)
    keep = edgeplug.get_backend(fb.KEEP, registry=m)
    assert keep.name == fb.KEEP and keep.plugin.name == "fixture-backends-own"
    assert torch.ops.aten.rms_norm.default in keep.keep_whole


def test_lowering_parts_take_the_resolved_backend_not_the_default(own_registry):
    m, fb = own_registry

    class Norm(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.rms_norm(x, (8,), torch.ones(8), 1e-6).relu()

    part = CorePartitioner(edgeplug.get_backend(fb.KEEP, registry=m), dry_run=True)
    ep = torch.export.export(Norm(), (torch.randn(2, 8),))
    to_edge_transform_and_lower(ep, partitioner=[part], compile_config=EdgeCompileConfig(_check_ir_validity=False))
    assert part.partitions and part.outcome.tags
    with pytest.raises(edgeplug.UnknownBackendError):  # the default still knows nothing of it
        edgeplug.get_backend(fb.KEEP)


def test_two_registries_do_not_share_what_they_loaded(own_registry):
    m, fb = own_registry
    other = PluginManager()
    assert backend_names(other) == []  # EDGEPLUG_PLUGINS allows no entry point, and nothing is registered here
    other.register(fb, "fixture-backends-other")
    assert backend_names(other) == sorted(fb.ALL) == backend_names(m)
    m.unregister("fixture-backends-own")
    assert backend_names(m) == [] and backend_names(other) == sorted(fb.ALL)
