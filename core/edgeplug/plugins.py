"""The plugin manager: discovery, blocking, validation, conflicts.

Plugins are found through entry points of group ``edgeplug`` (and modules
registered with ``register``). Nothing loads at ``import edgeplug``; the first
call that needs plugins loads them once and caches the result, until
``reset()`` or a change of the two environment variables:

- ``EDGEPLUG_DISABLE_PLUGINS``: comma-separated plugin (entry point) or
  distribution names never to load (registered plugins included);
- ``EDGEPLUG_PLUGINS``: if set, only these entry-point plugins load (plugins
  registered with ``register`` are explicit and always load unless blocked).

Names compare case-insensitively with ``-``, ``_`` and ``.`` equivalent, as
distribution names do (``edgeplug_qnn`` blocks ``edgeplug-qnn``).

A plugin that fails to import, whose hook raises, or that returns an invalid
record is dropped whole and reported (``problems()``) with its entry point,
distribution and how to disable it; every other plugin keeps working.
Conflicts (two backends of one name, two kernels for one op of one backend)
raise ``PluginConflictError`` naming both distributions.

This module is the only one that talks to pluggy.
"""

from __future__ import annotations

import os
import re
import threading
import warnings
import types
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import pluggy
from pydantic import BaseModel, ValidationError

from edgeplug import hookspecs
from edgeplug.errors import PluginConflictError
from edgeplug.records import HOOK_RECORDS, BackendSpec, Kernel

ENTRY_POINT_GROUP = "edgeplug"
ENV_DISABLE = "EDGEPLUG_DISABLE_PLUGINS"
ENV_ALLOW = "EDGEPLUG_PLUGINS"
REGISTERED = "<registered>"


class PluginWarning(UserWarning):
    """Issued once per load for each plugin that was dropped (see ``problems()``)."""


@dataclass(frozen=True)
class PluginInfo:
    """Where a plugin came from."""

    name: str
    distribution: str
    version: str
    entry_point: str  # "name = module:attr", or "<register()>"

    @property
    def registered(self) -> bool:
        """True for a plugin added with ``register()`` rather than an entry point."""
        return self.distribution == REGISTERED

    def describe(self) -> str:
        if self.registered:
            return f"plugin {self.name!r} (registered with edgeplug.plugins.register())"
        return (
            f"plugin {self.name!r} (entry point '{self.entry_point}', "
            f"distribution {self.distribution} {self.version})"
        )


@dataclass(frozen=True)
class PluginProblem:
    """A plugin that was dropped, and why."""

    plugin: PluginInfo
    stage: str  # "import", "hook edgeplug_backends", ...
    cause: str

    @property
    def message(self) -> str:
        if self.plugin.registered:
            remedy = f"unregister it with edgeplug.plugins.unregister({self.plugin.name!r})"
        else:
            remedy = f"uninstall {self.plugin.distribution}"
        return (
            f"{self.plugin.describe()} failed at {self.stage}: {self.cause}. "
            f"Its backends are unavailable; the others still work. To silence this, "
            f"disable it with {ENV_DISABLE}={self.plugin.name} or {remedy}."
        )

    def __str__(self) -> str:
        return self.message


@dataclass
class _Loaded:
    records: dict[str, list[tuple[PluginInfo, BaseModel]]] = field(default_factory=dict)
    problems: list[PluginProblem] = field(default_factory=list)
    plugins: list[PluginInfo] = field(default_factory=list)
    skipped: list[tuple[PluginInfo, str]] = field(default_factory=list)


def _normalize(name: str) -> str:
    # PEP 503: distribution names compare case-insensitively, with runs of
    # '-', '_' and '.' equivalent; plugin names follow the same rule here.
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def _split(value: Optional[str]) -> Optional[set[str]]:
    if value is None:
        return None
    return {_normalize(v) for v in value.split(",") if v.strip()}


def _format_validation(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "record"
        parts.append(f"{loc}: {e['msg']}")
    return f"invalid {err.title} record ({'; '.join(parts)})"


def _entry_points() -> list[Any]:
    try:
        from importlib.metadata import entry_points
    except ImportError:  # pragma: no cover
        from importlib_metadata import entry_points  # type: ignore
    return sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)


class PluginManager:
    """Loads plugins lazily and serves validated records."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._registered: list[tuple[types.ModuleType | object, PluginInfo]] = []
        self._loaded: Optional[_Loaded] = None
        self._env_key: Optional[tuple[Optional[str], Optional[str]]] = None

    # -- programmatic registration (tests, embedding) -------------------------
    def register(self, plugin: object, name: Optional[str] = None) -> PluginInfo:
        """Register a module (or object) of hookimpls without an entry point."""
        pname = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        info = PluginInfo(pname, REGISTERED, "", "<edgeplug.plugins.register()>")
        with self._lock:
            self._registered.append((plugin, info))
            self._loaded = None
        return info

    def unregister(self, plugin_or_name: object) -> None:
        with self._lock:
            self._registered = [
                (p, i)
                for p, i in self._registered
                if p is not plugin_or_name and i.name != plugin_or_name
            ]
            self._loaded = None

    def reset(self) -> None:
        """Forget what was loaded (plugins are discovered again on next use)."""
        with self._lock:
            self._loaded = None

    # -- loading ---------------------------------------------------------------
    def _state(self) -> _Loaded:
        key = (os.environ.get(ENV_DISABLE), os.environ.get(ENV_ALLOW))
        with self._lock:
            if self._loaded is None or key != self._env_key:
                self._loaded = self._load(*key)
                self._env_key = key
            return self._loaded

    def _load(self, disable: Optional[str], allow: Optional[str]) -> _Loaded:
        blocked = _split(disable) or set()
        allowed = _split(allow)
        state = _Loaded()
        candidates: list[tuple[Any, PluginInfo, bool]] = []  # (ep or module, info, is_ep)
        for ep in _entry_points():
            dist = getattr(ep, "dist", None)
            info = PluginInfo(
                name=ep.name,
                distribution=getattr(dist, "name", None) or "<unknown>",
                version=getattr(dist, "version", None) or "",
                entry_point=f"{ep.name} = {ep.value}",
            )
            names = {_normalize(info.name), _normalize(info.distribution)}
            if names & blocked:
                state.skipped.append((info, f"blocked by {ENV_DISABLE}={disable}"))
                continue
            if allowed is not None and not names & allowed:
                state.skipped.append((info, f"not in {ENV_ALLOW}={allow}"))
                continue
            candidates.append((ep, info, True))
        for module, info in self._registered:
            if _normalize(info.name) in blocked:
                state.skipped.append((info, f"blocked by {ENV_DISABLE}={disable}"))
                continue
            candidates.append((module, info, False))

        for obj, info, is_ep in candidates:
            if is_ep:
                try:
                    obj = obj.load()
                except Exception as exc:  # a broken plugin must not break the others
                    state.problems.append(
                        PluginProblem(info, "import", f"{type(exc).__name__}: {exc}")
                    )
                    continue
            records, problem = self._collect(obj, info)
            if problem is not None:
                state.problems.append(problem)
                continue
            state.plugins.append(info)
            for hook, recs in records.items():
                state.records.setdefault(hook, []).extend((info, r) for r in recs)
        self._check_conflicts(state)
        for problem in state.problems:
            warnings.warn(problem.message, PluginWarning, stacklevel=4)
        return state

    @staticmethod
    def _collect(
        plugin: object, info: PluginInfo
    ) -> tuple[dict[str, list[BaseModel]], Optional[PluginProblem]]:
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        try:
            pm.register(plugin, name=info.name)
            pm.check_pending()  # a misspelt hook would otherwise be ignored silently
        except Exception as exc:  # e.g. a hookimpl with an unknown name or argument
            known = ", ".join(HOOK_RECORDS)
            return {}, PluginProblem(
                info, "registration", f"{type(exc).__name__}: {exc} (the hooks are: {known})"
            )
        out: dict[str, list[BaseModel]] = {}
        for hook, record_type in HOOK_RECORDS.items():
            caller = getattr(pm.hook, hook)
            for impl in caller.get_hookimpls():
                stage = f"hook {hook}"
                try:
                    result = impl.function()
                    if result is None:
                        items = []
                    elif isinstance(result, (BaseModel, dict)):
                        items = [result]  # one record returned rather than yielded
                    else:
                        items = list(result)
                except ValidationError as exc:
                    return {}, PluginProblem(info, stage, _format_validation(exc))
                except Exception as exc:
                    return {}, PluginProblem(info, stage, f"{type(exc).__name__}: {exc}")
                for item in items:
                    if isinstance(item, record_type):
                        out.setdefault(hook, []).append(item)
                        continue
                    if isinstance(item, dict):
                        try:
                            out.setdefault(hook, []).append(record_type.model_validate(item))
                            continue
                        except ValidationError as exc:
                            return {}, PluginProblem(info, stage, _format_validation(exc))
                    return {}, PluginProblem(
                        info,
                        stage,
                        f"returned {type(item).__name__} {item!r:.80}, expected "
                        f"edgeplug.records.{record_type.__name__}",
                    )
        return out, None

    @staticmethod
    def _check_conflicts(state: _Loaded) -> None:
        seen: dict[Any, PluginInfo] = {}
        for info, rec in state.records.get("edgeplug_backends", []):
            assert isinstance(rec, BackendSpec)
            key = ("backend", rec.backend)
            other = seen.get(key)
            if other is not None:
                raise PluginConflictError(
                    f"backend {rec.backend!r} is registered twice: by distribution "
                    f"{other.distribution} (plugin {other.name!r}) and by distribution "
                    f"{info.distribution} (plugin {info.name!r}). Uninstall one, or "
                    f"disable one with {ENV_DISABLE}=<plugin>."
                )
            seen[key] = info
        for info, rec in state.records.get("edgeplug_kernels", []):
            assert isinstance(rec, Kernel)
            key = ("kernel", rec.backend, rec.op, rec.device)
            other = seen.get(key)
            if other is not None:
                raise PluginConflictError(
                    f"two kernels for op {rec.op!r} on backend {rec.backend!r} "
                    f"({rec.device}): from distribution {other.distribution} "
                    f"(plugin {other.name!r}) and from distribution {info.distribution} "
                    f"(plugin {info.name!r}). Uninstall one, or disable one with "
                    f"{ENV_DISABLE}=<plugin>."
                )
            seen[key] = info

    # -- queries ---------------------------------------------------------------
    def records(self, hook: str, backend: Optional[str] = None) -> list[tuple[PluginInfo, Any]]:
        items = self._state().records.get(hook, [])
        if backend is None:
            return list(items)
        return [(i, r) for i, r in items if r.backend == backend]

    def backend_specs(self) -> dict[str, tuple[PluginInfo, BackendSpec]]:
        return {r.backend: (i, r) for i, r in self.records("edgeplug_backends")}

    def problems(self) -> list[PluginProblem]:
        return list(self._state().problems)

    def plugins(self) -> list[PluginInfo]:
        return list(self._state().plugins)

    def skipped(self) -> list[tuple[PluginInfo, str]]:
        return list(self._state().skipped)


_manager = PluginManager()


def manager() -> PluginManager:
    return _manager


def register(plugin: object, name: Optional[str] = None) -> PluginInfo:
    """Register a module of hookimpls (for tests and embedding)."""
    return _manager.register(plugin, name)


def unregister(plugin_or_name: object) -> None:
    _manager.unregister(plugin_or_name)


def reset() -> None:
    _manager.reset()


def problems() -> list[PluginProblem]:
    """Plugins that were dropped (failed import, raising hook, invalid record)."""
    return _manager.problems()


def skipped() -> list[tuple[PluginInfo, str]]:
    """Plugins not loaded because of EDGEPLUG_DISABLE_PLUGINS / EDGEPLUG_PLUGINS, and why."""
    return _manager.skipped()
