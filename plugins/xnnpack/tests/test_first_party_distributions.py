"""The first-party backends are installed, each by its own distribution (moved from the core's tests)."""

from __future__ import annotations

import edgeplug
from edgeplug._registry import lookup as plugins

FIRST_PARTY = {"coreml", "qnn", "samsung", "vulkan", "webgpu", "xnnpack"}


def test_first_party_backends_are_installed_with_their_distributions(monkeypatch):
    monkeypatch.delenv("EDGEPLUG_PLUGINS", raising=False)
    monkeypatch.delenv("EDGEPLUG_DISABLE_PLUGINS", raising=False)
    plugins.reset()
    assert FIRST_PARTY <= set(edgeplug.backends())
    for name in FIRST_PARTY:
        b = edgeplug.get_backend(name)
        assert b.name == name
        assert b.distribution == f"edgeplug-{name}"
        assert b.plugin.entry_point == f"{name} = edgeplug_{name}.hooks"
    assert plugins.problems() == []
