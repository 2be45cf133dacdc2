"""The process's plugins: the one default ``PluginManager`` and the façade functions that read it.

Everything below the façade takes a registry (``edgeplug._registry.PluginManager``)
or a ``Backend`` already resolved; only ``edgeplug.backends``, ``get_backend``,
``register_plugin``, ``unregister_plugin``, ``plugin_problems``, ``lower`` (for a
backend given by name), the CLI and the conformance suite read this one.
"""

from __future__ import annotations

from typing import Optional

from edgeplug._backend import Backend, backend_names, resolve_backend
from edgeplug._registry import BackendProblem, PluginInfo, PluginManager, PluginProblem, UnclaimedRecord

_default = PluginManager()


def manager() -> PluginManager:
    """The process's default plugin manager (entry points plus what ``register`` added)."""
    return _default


def backends() -> list[str]:
    """Names of installed, loadable backends, sorted."""
    return backend_names(_default)


def get_backend(name: str) -> Backend:
    """Resolve one backend's contributions across every loaded plugin."""
    return resolve_backend(_default, name)


def register(plugin: object, name: Optional[str] = None) -> PluginInfo:
    """Register a module of hookimpls (for tests and embedding)."""
    return _default.register(plugin, name)


def unregister(plugin_or_name: object) -> None:
    """Remove a plugin registered in-process with ``register`` (given by the object or its name)."""
    _default.unregister(plugin_or_name)


def reset() -> None:
    """Forget what was loaded: plugins are discovered again on next use."""
    _default.reset()


def problems() -> list[PluginProblem]:
    """Plugins that were dropped (failed import, raising hook, invalid record)."""
    return _default.problems()


def skipped() -> list[tuple[PluginInfo, str]]:
    """Plugins not loaded because of EDGEPLUG_DISABLE_PLUGINS / EDGEPLUG_PLUGINS, and why."""
    return _default.skipped()


def conflicts() -> list[BackendProblem]:
    """Backends made unavailable by contributions that contradict each other (both plugins named)."""
    return _default.conflicts()


def unclaimed() -> list[UnclaimedRecord]:
    """Records for a backend no loaded plugin registers (ignored)."""
    return _default.unclaimed()
