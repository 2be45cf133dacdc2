"""The process's plugins: the one default ``PluginManager``, the façade functions that read it, and
``get_backend``, the one lookup of a backend by name (in that registry or one passed in).

Everything below the façade takes a registry (``edgeplug._registry.PluginManager``)
or a ``Backend`` already resolved; only ``edgeplug.backends``, ``get_backend``,
``register_plugin``, ``unregister_plugin``, ``plugin_problems``, ``lower`` (for a
backend given by name), the CLI and the conformance suite read this one.
"""

from __future__ import annotations

import difflib
from typing import Any, Optional, TypeVar

from edgeplug._backend import FIRST_PARTY, INSTALL_HINT, Backend, backend_names
from edgeplug._errors import PluginConflictError, UnknownBackendError
from edgeplug._records import FusionPolicy, KeepWhole, Kernel, PartitionerFilter
from edgeplug._registry import BackendProblem, PluginInfo, PluginManager, PluginProblem, UnclaimedRecord

R = TypeVar("R")

_default = PluginManager()


def manager() -> PluginManager:
    """The process's default plugin manager (entry points plus what ``register`` added)."""
    return _default


def backends() -> list[str]:
    """Names of installed, loadable backends, sorted."""
    return backend_names(_default)


def get_backend(name: str, *, registry: Optional[PluginManager] = None) -> Backend:
    """Resolve one backend's contributions across every plugin loaded: the process's plugins, or those of
    ``registry``, a ``PluginManager`` of one's own (tests, embedding). The name is matched without case or
    surrounding spaces; two plugins that contradict each other for it raise ``PluginConflictError``, a name no
    plugin registers ``UnknownBackendError`` (saying what is close, what failed to load and what to install)."""
    m = _default if registry is None else registry
    key = name.strip().lower()
    conflict = m.conflict(key)
    if conflict is not None:
        raise PluginConflictError(conflict.message)
    specs = m.backend_specs()
    if key not in specs:
        raise _unknown(m, name, key, specs)
    info, spec = specs[key]
    contributions = tuple(m.contributions(backend=key))

    def of(record_type: type[R]) -> tuple[R, ...]:
        return tuple(c.record for c in contributions if isinstance(c.record, record_type))

    keep_whole = tuple(dict.fromkeys(op for rec in of(KeepWhole) for op in rec.ops))
    return Backend(
        spec=spec,
        plugin=info,
        keep_whole=keep_whole,
        filters=of(PartitionerFilter),
        fusion_policies=of(FusionPolicy),
        kernels=of(Kernel),
        passes=m.pass_order(key),
        contributions=contributions,
    )


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


def _is_named(info: PluginInfo, backend: str) -> bool:
    return backend in (info.name.lower(), info.distribution.lower().removeprefix("edgeplug-"))


def _unknown(m: PluginManager, name: str, key: str, specs: dict[str, Any]) -> UnknownBackendError:
    msg = f"no backend named {name!r}"
    close = difflib.get_close_matches(key, [*specs, *FIRST_PARTY], n=1, cutoff=0.6)
    msg += f"; did you mean {close[0]!r}?" if close and close[0] != key else "."
    broken = m.problems()
    if broken:
        msg += " Some plugins failed to load: " + " | ".join(p.message for p in broken)
    skipped = m.skipped()
    if skipped:
        msg += " Not loaded: " + ", ".join(f"plugin {i.name!r} ({i.distribution}, {why})" for i, why in skipped) + "."
    installed = ", ".join(sorted(specs)) or "none"
    msg += f" Installed backends: {installed}."
    if key in FIRST_PARTY and not any(_is_named(i, key) for i, _ in skipped) and not broken:
        msg += f" Install it with `pip install edgeplug-{key}`."
    elif not specs and not broken:
        msg += f" Backends come from plugins: {INSTALL_HINT}."
    return UnknownBackendError(msg)
