"""The plugin manager: loads plugins on first use, caches what it found, answers queries.

A ``PluginManager`` is an ordinary object: code that needs plugins is given
one (the process's default lives in ``edgeplug._registry.lookup``, read only by the
façade, the CLI and the conformance suite).
"""

from __future__ import annotations

import os
import threading
import types
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from edgeplug._records import HOOK_RECORDS, BackendSpec, FusionPolicy, Kernel, PassSpec, QuantScheme
from edgeplug._registry.info import (
    ENV_ALLOW,
    ENV_DISABLE,
    ENV_REGISTER,
    REGISTERED,
    BackendProblem,
    Contribution,
    Loaded,
    PluginInfo,
    PluginProblem,
    PluginWarning,
    UnclaimedRecord,
    normalize_name,
    who,
)
from edgeplug._registry.loading import load
from edgeplug._registry.ranges import declared_range, outside_declared_range
from edgeplug._registry.validation import check
from edgeplug._user_code import Effects, contained, torch_defaults_lines


def _effects_lines(effects: Effects) -> list[str]:
    """What loading the plugins did to the process, already undone: one sentence each."""
    lines = torch_defaults_lines(effects, "a plugin's import or hook")
    if effects.chdir is not None:
        folder, where = effects.chdir
        lines.append(
            f"a plugin's import or hook changed the working folder to {folder}{f' at {where}' if where else ''}; "
            "edgeplug went back (a plugin must not change the process's folder)"
        )
    return lines


class PluginManager:
    """Loads plugins lazily and serves validated records."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._registered: list[tuple[types.ModuleType | object, PluginInfo]] = []
        self._loaded: Optional[Loaded] = None
        self._env_key: Optional[tuple[Optional[str], ...]] = None

    # -- programmatic registration (tests, embedding) -------------------------
    def register(self, plugin: object, name: Optional[str] = None) -> PluginInfo:
        """Register a module (or object) of hookimpls without an entry point."""
        pname = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        info = PluginInfo(pname, REGISTERED, "", "<edgeplug.register_plugin()>")
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
    def _state(self) -> Loaded:
        key = (os.environ.get(ENV_DISABLE), os.environ.get(ENV_ALLOW), os.environ.get(ENV_REGISTER))
        with self._lock:
            if self._loaded is None or key != self._env_key:
                self._loaded = self._load(*key)
                self._env_key = key
            return self._loaded

    def _load(self, disable: Optional[str], allow: Optional[str], named: Optional[str]) -> Loaded:
        # plugins' imports and hooks are code edgeplug does not own: what they print goes to stderr (never
        # into a .pte streamed to stdout), a change of folder or of torch's defaults is undone and named
        effects = Effects()
        with contained(effects, stdout_to_stderr=True):
            state = load(self._registered, disable, allow, named)
        check(state)
        problems: list[Any] = [*state.problems, *state.conflicts.values(), *state.unclaimed]
        for problem in problems:
            warnings.warn(problem.message, PluginWarning, stacklevel=4)
        for line in _effects_lines(effects):
            warnings.warn(line, PluginWarning, stacklevel=4)
        for info in state.plugins:
            outside = outside_declared_range(info)
            if outside:
                warnings.warn(outside, PluginWarning, stacklevel=4)
        return state

    # -- queries ---------------------------------------------------------------
    def contributions(
        self, kind: Union[type, str, None] = None, backend: Optional[str] = None
    ) -> list[Contribution]:
        """Records with the plugin that yielded each, of one record type (or hook name) and backend.

        Records of a backend that is unavailable because of a conflict are
        included; records for a backend no plugin registers are not (see
        ``unclaimed()``).
        """
        if isinstance(kind, str):
            kind = HOOK_RECORDS[kind]
        return [
            c
            for c in self._state().contributions
            if (kind is None or isinstance(c.record, kind)) and (backend is None or c.record.backend == backend)
        ]

    def backend_specs(self) -> dict[str, tuple[PluginInfo, BackendSpec]]:
        """Registered backends that are available (no conflict): name -> (plugin, spec)."""
        state = self._state()
        return {
            c.record.backend: (c.plugin, c.record)
            for c in self.contributions(BackendSpec)
            if c.record.backend not in state.conflicts
        }

    def pass_order(self, backend: str) -> tuple[PassSpec, ...]:
        """A backend's passes (every stage) in run order."""
        return self._state().pass_order.get(backend, ())

    def conflict(self, backend: str) -> Optional[BackendProblem]:
        return self._state().conflicts.get(backend)

    def conflicts(self) -> list[BackendProblem]:
        return list(self._state().conflicts.values())

    def unclaimed(self) -> list[UnclaimedRecord]:
        return list(self._state().unclaimed)

    def problems(self) -> list[PluginProblem]:
        return list(self._state().problems)

    def plugins(self) -> list[PluginInfo]:
        return list(self._state().plugins)

    def skipped(self) -> list[tuple[PluginInfo, str]]:
        return list(self._state().skipped)


@dataclass(frozen=True)
class PluginSummary:
    """One plugin as ``edgeplug plugins`` shows it."""

    plugin: PluginInfo
    #: "loaded", "broken" or "blocked"
    status: str
    #: why it is broken or blocked ("" when loaded)
    reason: str = ""
    #: backend -> what this plugin contributes to it, one phrase per record
    contributes: dict[str, list[str]] = field(default_factory=dict)
    #: backend -> why the backend is unavailable (a conflict) or its records ignored
    trouble: dict[str, str] = field(default_factory=dict)
    #: the plugin API it was written for (None: broken or blocked before it was read)
    api_version: Optional[int] = None
    #: the old spellings it uses, each saying its new spelling and when the old one goes
    deprecated: tuple[str, ...] = ()
    #: the executorch range its distribution declares (``Requires-Dist``), None where it declares none
    executorch: Optional[str] = None
    #: why the installed executorch is outside that range ("" inside it, or where none is declared)
    executorch_warning: str = ""


def describe_record(record: Any) -> str:
    """A short phrase for one record: 'kernel et_vk.rms_norm.default (wgpu)', 'edge pass fold_bn'."""
    name = type(record).__name__
    if isinstance(record, BackendSpec):
        return f"the backend itself (delegate {record.backend_id}, verify: {record.verify_method})"
    if name == "KeepWhole":
        return "keep whole: " + ", ".join(str(op) for op in record.ops)
    if name == "PartitionerFilter":
        return f"filter {record.name!r}"
    if isinstance(record, FusionPolicy):
        return f"fusion {getattr(record, 'pattern', '?')} -> {record.target}"
    if isinstance(record, Kernel):
        return f"kernel {record.op} ({record.device})"
    if isinstance(record, PassSpec):
        return f"{record.stage} pass {record.name!r}"
    if isinstance(record, QuantScheme):
        how = " (torchao source transform)" if record.kind == "source_transform" else ""
        return f"quantization scheme {record.scheme!r}{how}"
    return name


def summaries(manager: PluginManager) -> list[PluginSummary]:
    """Every plugin ``manager`` found: loaded (with its contributions per backend), broken (with why), blocked."""
    state = manager._state()
    out: list[PluginSummary] = []
    registrant = {c.record.backend: c.plugin for c in state.contributions if isinstance(c.record, BackendSpec)}
    for info in state.plugins:
        contributes: dict[str, list[str]] = {}
        trouble: dict[str, str] = {}
        for c in state.contributions:
            if c.plugin != info:
                continue
            backend = c.record.backend
            contributes.setdefault(backend, []).append(describe_record(c.record))
            owner = registrant.get(backend)
            if owner is not None and owner != info and backend not in trouble:
                trouble[backend] = f"added to a backend of {who(owner)}"
            conflict = state.conflicts.get(backend)
            if conflict is not None:
                trouble[backend] = conflict.message
        for u in state.unclaimed:
            if u.contribution.plugin == info:
                backend = u.contribution.record.backend
                contributes.setdefault(backend, []).append(describe_record(u.contribution.record))
                trouble[backend] = "ignored: " + u.message
        api, old = state.api.get(info, (None, []))
        out.append(PluginSummary(
            info, "loaded", "", contributes, trouble, api, tuple(r.sentence() for r in old),
            declared_range(info), outside_declared_range(info) or "",
        ))
    for problem in state.problems:
        out.append(PluginSummary(problem.plugin, "broken", f"failed at {problem.stage}: {problem.cause}"))
    for info, why in state.skipped:
        out.append(PluginSummary(info, "blocked", why))
    return sorted(out, key=lambda s: (normalize_name(s.plugin.name), s.plugin.distribution))


