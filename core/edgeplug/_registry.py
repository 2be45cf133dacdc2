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

A plugin that fails to import, whose hook raises (the message keeps the
file and line), that returns an invalid record, or that has an ``edgeplug_*``
function without ``@edgeplug.hookimpl`` is dropped whole and reported
(``problems()``) with its entry point, distribution and how to disable it;
every other plugin keeps working.

Records are kept with the plugin that yielded them (``Contribution``) and
looked up by record type. Contributions that contradict each other make only
the contested backend unavailable (``conflicts()``; ``get_backend`` raises
``PluginConflictError`` naming both distributions): two backends of one name,
two kernels for one op and device, two fusion policies for one pattern, two
passes of one name, pass constraints naming no pass or forming a cycle.
A record for a backend no loaded plugin registers is ignored and reported
(``unclaimed()``), with the nearest registered name.

This module is the only one that talks to pluggy.
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
import threading
import traceback
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Optional, Union

import pluggy
from pydantic import BaseModel, ValidationError

from edgeplug import _hookspecs as hookspecs
from edgeplug._records import (
    HOOK_RECORDS,
    BackendSpec,
    FusionPolicy,
    Kernel,
    PassSpec,
    QuantScheme,
)

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
            return f"plugin {self.name!r} (registered with edgeplug.register_plugin())"
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
            remedy = f"unregister it with edgeplug.unregister_plugin({self.plugin.name!r})"
        else:
            remedy = f"uninstall {self.plugin.distribution}"
        return (
            f"{self.plugin.describe()} failed at {self.stage}: {self.cause}. "
            f"Its backends are unavailable; the others still work. To silence this, "
            f"disable it with {ENV_DISABLE}={self.plugin.name} or {remedy}."
        )

    def __str__(self) -> str:
        return self.message


class Contribution(NamedTuple):
    """One record and the plugin that yielded it."""

    plugin: PluginInfo
    record: Any


def _who(info: PluginInfo) -> str:
    if info.registered:
        return f"plugin {info.name!r} (registered in code)"
    return f"distribution {info.distribution} (plugin {info.name!r})"


@dataclass(frozen=True)
class BackendProblem:
    """A backend made unavailable because contributions to it contradict each other."""

    backend: str
    cause: str
    plugins: tuple[PluginInfo, ...]

    @property
    def message(self) -> str:
        blame = self.newcomer
        if blame.registered:
            fix = f"unregister one with edgeplug.unregister_plugin({blame.name!r})"
        else:
            fix = f"uninstall one, or disable the newcomer with {ENV_DISABLE}={blame.name}"
        return (
            f"backend {self.backend!r} is unavailable: {self.cause}. To use it, {fix}. "
            "Every other backend keeps working."
        )

    @property
    def newcomer(self) -> PluginInfo:
        """The plugin to disable: not the one named after the backend (its owner), else the last loaded.

        ``edgeplug-vulkan`` owns backend ``vulkan``; a clone or add-on that
        contradicts it is the one a user just installed, whatever its name
        sorts as.
        """
        norm = _normalize(self.backend)

        def owns(p: PluginInfo) -> bool:
            return norm in (_normalize(p.name), _normalize(p.distribution).removeprefix("edgeplug-"))

        ranked = [p for p in self.plugins if not p.registered and not owns(p)]
        ranked = ranked or [p for p in self.plugins if not p.registered] or list(self.plugins)
        return ranked[-1]

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class UnclaimedRecord:
    """A record naming a backend that no loaded plugin registers (it is ignored)."""

    contribution: Contribution
    registered: tuple[str, ...]

    @property
    def message(self) -> str:
        info, rec = self.contribution
        close = difflib.get_close_matches(rec.backend, self.registered, n=1)
        hint = f"Did you mean {close[0]!r}? " if close else ""
        return (
            f"{info.describe()} yields a {type(rec).__name__} for backend {rec.backend!r}, which no "
            f"loaded plugin registers (registered: {', '.join(self.registered) or 'none'}); it is "
            f"ignored. {hint}Fix the backend name in the plugin, or install the plugin that "
            f"registers {rec.backend!r}."
        )

    def __str__(self) -> str:
        return self.message


@dataclass
class _Loaded:
    contributions: list[Contribution] = field(default_factory=list)
    problems: list[PluginProblem] = field(default_factory=list)
    plugins: list[PluginInfo] = field(default_factory=list)
    skipped: list[tuple[PluginInfo, str]] = field(default_factory=list)
    conflicts: dict[str, BackendProblem] = field(default_factory=dict)
    unclaimed: list[UnclaimedRecord] = field(default_factory=list)
    #: backend name -> its passes in run order
    pass_order: dict[str, tuple[PassSpec, ...]] = field(default_factory=dict)


def _normalize(name: str) -> str:
    # PEP 503: distribution names compare case-insensitively, with runs of
    # '-', '_' and '.' equivalent; plugin names follow the same rule here.
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def _split(value: Optional[str]) -> Optional[set[str]]:
    if value is None or not value.strip():
        return None  # set but empty (EDGEPLUG_PLUGINS=) means unset, not "allow nothing"
    return {_normalize(v) for v in value.split(",") if v.strip()}


def _format_validation(err: ValidationError, hook: str = "") -> str:
    """'invalid X record from hook H: field F = VALUE (why)': every field pydantic rejected, with its value."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "record"
        value = e.get("input")
        shown = "" if isinstance(value, dict) and e["loc"] == () else f" = {_bounded(value)}"
        parts.append(f"field {loc!r}{shown}: {e['msg']}")
    source = f" from hook {hook}" if hook else ""
    return f"invalid {err.title} record{source}: {'; '.join(parts)}"


def _bounded(value: Any, width: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _own_paths(info: PluginInfo, plugin: object = None) -> tuple[set[str], tuple[str, ...]]:
    """(files, folders) that hold the plugin's own code: its distribution's files and its top-level module.

    An editable install lists only a ``.pth`` or finder among its files, so
    the entry point's top-level module (found without importing it) or the
    plugin object's module adds its folder (a package) or its file.
    """
    files: set[str] = set()
    dirs: list[str] = []
    if not info.registered:
        try:
            from importlib.metadata import distribution

            for f in distribution(info.distribution).files or ():
                if str(f).endswith(".py"):
                    files.add(str(Path(f.locate()).resolve()))
        except Exception:  # no metadata to read: the module below still locates it
            pass
    tops = {t for t in (_package(info), _package(info, plugin) if plugin is not None else None) if t}
    for top in tops:
        import importlib.util

        try:
            spec = importlib.util.find_spec(top)
        except Exception:  # a broken parent package: nothing to add
            spec = None
        if spec is None:
            continue
        for loc in spec.submodule_search_locations or ():
            dirs.append(str(Path(loc).resolve()) + os.sep)
        if not spec.submodule_search_locations and spec.origin:
            files.add(str(Path(spec.origin).resolve()))
    return files, tuple(dirs)


def _where(exc: BaseException, info: PluginInfo, plugin: object = None) -> str:
    """' (raised at FILE:LINE in FUNC)': the innermost frame of the plugin's own code.

    Own code is a file of the plugin's distribution or of its top-level
    module; a ``SyntaxError`` in it is located by its own file and line.
    Without one, the entry point (or the registered module) is named.
    """
    files, dirs = _own_paths(info, plugin)

    def own(filename: Optional[str]) -> bool:
        if not filename or filename.startswith("<"):
            return False
        path = str(Path(filename).resolve())
        return path in files or path.startswith(dirs)

    cur: Optional[BaseException] = exc
    seen: set[int] = set()
    while cur is not None and id(cur) not in seen:  # the exception, then what it was raised from
        seen.add(id(cur))
        if isinstance(cur, SyntaxError) and own(cur.filename):
            return f" (raised at {cur.filename}:{cur.lineno})"
        frames = [f for f in traceback.extract_tb(cur.__traceback__) if own(f.filename)]
        if frames:
            f = frames[-1]
            return f" (raised at {f.filename}:{f.lineno} in {f.name})"
        cur = cur.__cause__ or cur.__context__
    if info.registered:
        return f" (no frame of the plugin's code in the traceback; registered as {_package(info, plugin) or info.name!r})"
    return f" (no frame of the plugin's code in the traceback; its entry point is '{info.entry_point}')"


def plugin_location(exc: BaseException, info: PluginInfo) -> str:
    """' (raised at FILE:LINE in FUNC)': where in the plugin's own code ``exc`` was raised (or its entry point)."""
    return _where(exc, info)


def _package(info: PluginInfo, plugin: object = None) -> Optional[str]:
    """The plugin's top-level module name, from its entry point or its object."""
    if plugin is not None:
        name = getattr(plugin, "__name__", None) if inspect.ismodule(plugin) else type(plugin).__module__
        return (name or "").split(".")[0] or None
    value = info.entry_point.partition("=")[2].strip()
    return value.split(":")[0].split(".")[0] or None


def _failure(exc: BaseException, info: PluginInfo, plugin: object = None) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}{_where(exc, info, plugin)}" if text else f"{type(exc).__name__}{_where(exc, info, plugin)}"


class NotRecords(TypeError):
    """A hook returned something that is not records (a str, a dict, a number)."""


def _records_of(result: Any, hook: str) -> list[tuple[Any, str]]:
    """What a hook returned as (item, ' (yielded at FILE:LINE)') pairs: None is none, a record is one.

    A generator's items are located by the line it was suspended at. A str,
    bytes or a dict is not iterated (a string's characters, a dict's keys are
    never records); anything else that is not iterable is refused.
    """
    if result is None:
        return []
    if isinstance(result, BaseModel):
        return [(result, "")]  # one record returned rather than yielded
    if isinstance(result, (str, bytes, dict)) or not hasattr(result, "__iter__"):
        raise NotRecords(
            f"returned {type(result).__name__} {_bounded(result)}; {hook} must yield records "
            "(or return a list of them, or None)"
        )
    if not inspect.isgenerator(result):
        return [(item, "") for item in result]
    out = []
    for item in result:
        frame = result.gi_frame
        out.append((item, f" (yielded at {frame.f_code.co_filename}:{frame.f_lineno})" if frame is not None else ""))
    return out


def _defined_at(fn: Any) -> str:
    """' (hook at FILE:LINE)': the first statement of the hook's body, or '' where Python cannot locate it."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None:
        return ""
    body = sorted({line for _, _, line in code.co_lines() if line and line > code.co_firstlineno})
    return f" (hook at {code.co_filename}:{body[0] if body else code.co_firstlineno})"


ENV_HOOK_SECONDS = "EDGEPLUG_HOOK_TIMEOUT"
#: how long one hook may take to yield its records (declarations: a hook that
#: needs longer is doing work that belongs in a factory)
HOOK_SECONDS = 20.0


def _hook_seconds() -> float:
    text = os.environ.get(ENV_HOOK_SECONDS, "")
    try:
        return float(text) if text else HOOK_SECONDS
    except ValueError:
        return HOOK_SECONDS


class TimeLimit(Exception):
    """A plugin's code ran past its time limit (see ``_time_limit``)."""


def _importing(frame: Any) -> bool:
    """Whether ``frame`` (or a caller of it) is executing a module's import."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


class _time_limit:
    """Interrupt the block after ``seconds`` with ``TimeLimit`` (SIGALRM; main thread only).

    Where no alarm can be set (another thread, a platform without SIGALRM,
    an alarm handler the application installed) the block runs unlimited.
    An import in progress is never interrupted: the limit takes effect when
    it returns.
    """

    def __init__(self, seconds: float, what: str) -> None:
        self.seconds, self.what, self.armed, self.previous = seconds, what, False, None

    def __enter__(self) -> "_time_limit":
        import signal

        if (
            self.seconds <= 0
            or not hasattr(signal, "setitimer")
            or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, None)
        ):
            return self

        def expire(signum: int, frame: Any) -> None:
            if _importing(frame):  # stopping an import half-way leaves C extensions half-initialised
                signal.setitimer(signal.ITIMER_REAL, 0.05)  # (numpy then crashes the process): retry after it
                return
            raise TimeLimit(f"{self.what} took longer than {self.seconds:g} s and was stopped")

        self.previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        self.armed = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.armed:
            import signal

            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous if self.previous is not None else signal.SIG_DFL)


def _policy_problem(c: Contribution) -> Optional[str]:
    """Why a fusion policy's target cannot be emitted, for targets resolvable at load (no ``load_target``).

    A policy with ``load_target`` (a custom-op library, often slow to import)
    is checked by the conformance suite and when a program is fused.
    """
    policy = c.record
    if getattr(policy, "load_target", None) is not None:
        return None
    from edgeplug._fusion.target import PolicyTargetError, check_policy

    try:
        check_policy(policy)
    except PolicyTargetError as exc:
        return (
            f"the {getattr(policy, 'pattern', '')} fusion policy from {_who(c.plugin)} cannot be emitted: {exc}; "
            "fix the plugin's FusionPolicy"
        )
    return None


def order_passes(passes: list[Contribution]) -> list[Contribution]:
    """Passes of one backend in run order: every before/after constraint holds, then (order, as yielded).

    Raises ``ValueError`` naming the passes and plugins for a constraint that
    names no pass, one across stages, or a cycle.
    """
    by_name = {c.record.name: c for c in passes}
    after: dict[str, set[str]] = {name: set() for name in by_name}
    for c in passes:
        p = c.record
        for other, edge in [(o, (o, p.name)) for o in p.after] + [(o, (p.name, o)) for o in p.before]:
            target = by_name.get(other)
            if target is None:
                close = difflib.get_close_matches(other, list(by_name), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(
                    f"pass {p.name!r} from {_who(c.plugin)} must run "
                    f"{'after' if other in p.after else 'before'} {other!r}, which is no pass of "
                    f"backend {p.backend!r}{hint}; its passes: {', '.join(sorted(by_name))}"
                )
            if target.record.stage != p.stage:
                raise ValueError(
                    f"pass {p.name!r} ({p.stage} stage, from {_who(c.plugin)}) is constrained against "
                    f"{other!r}, which runs in the {target.record.stage} stage; constraints order passes "
                    "of one stage"
                )
            first, then = edge
            after[then].add(first)
    index = {c.record.name: i for i, c in enumerate(passes)}
    done: list[Contribution] = []
    placed: set[str] = set()
    while len(done) < len(passes):
        ready = [n for n in by_name if n not in placed and after[n] <= placed]
        if not ready:
            left = sorted(n for n in by_name if n not in placed)
            cycle = _a_cycle({n: after[n] - placed for n in left})
            raise ValueError(
                f"the before/after constraints of backend {passes[0].record.backend!r} form a cycle: "
                + " -> ".join(f"{n!r} ({_who(by_name[n].plugin)})" for n in cycle)
                + "; drop one of these constraints"
            )
        name = min(ready, key=lambda n: (by_name[n].record.order, index[n]))
        placed.add(name)
        done.append(by_name[name])
    return done


def _a_cycle(needs: dict[str, set[str]]) -> list[str]:
    """One cycle in a graph where every node still needs another (name -> names before it)."""
    node = next(iter(needs))
    path: list[str] = []
    while node not in path:
        path.append(node)
        node = sorted(needs[node])[0]
    cycle = path[path.index(node):]
    return [*reversed(cycle), cycle[-1]]


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
                    state.problems.append(PluginProblem(info, "import", _failure(exc, info)))
                    continue
            records, problem = self._collect(obj, info)
            if problem is not None:
                state.problems.append(problem)
                continue
            state.plugins.append(info)
            state.contributions.extend(Contribution(info, r) for r in records)
        self._check(state)
        for problem in [*state.problems, *state.conflicts.values(), *state.unclaimed]:
            warnings.warn(problem.message, PluginWarning, stacklevel=4)
        return state

    @staticmethod
    def _unmarked(plugin: object, pm: pluggy.PluginManager) -> Optional[str]:
        """An ``edgeplug_*`` function the plugin defines without the hookimpl marker."""
        for name in sorted(dir(plugin)):
            if not name.startswith(f"{hookspecs.PROJECT}_"):
                continue
            obj = getattr(plugin, name, None)
            if not callable(obj) or inspect.isclass(obj) or inspect.ismodule(obj):
                continue
            if pm.parse_hookimpl_opts(plugin, name) is None:
                known = ", ".join(HOOK_RECORDS)
                what = "" if name in HOOK_RECORDS else f", and names no hook (the hooks are: {known})"
                return (
                    f"function {name} is not marked @edgeplug.hookimpl, so it would never be "
                    f"called{what}; decorate it with @edgeplug.hookimpl (or rename it if it is no hook)"
                )
        return None

    @staticmethod
    def _collect(plugin: object, info: PluginInfo) -> tuple[list[BaseModel], Optional[PluginProblem]]:
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        try:
            pm.register(plugin, name=info.name)
            pm.check_pending()  # a misspelt hook would otherwise be ignored silently
        except Exception as exc:  # e.g. a hookimpl with an unknown name or argument
            known = ", ".join(HOOK_RECORDS)
            return [], PluginProblem(
                info, "registration", f"{type(exc).__name__}: {exc} (the hooks are: {known})"
            )
        unmarked = PluginManager._unmarked(plugin, pm)
        if unmarked is not None:
            return [], PluginProblem(info, "registration", unmarked)
        out: list[BaseModel] = []
        for hook, record_type in HOOK_RECORDS.items():
            caller = getattr(pm.hook, hook, None)
            for impl in caller.get_hookimpls() if caller is not None else ():
                stage = f"hook {hook}"
                try:
                    with _time_limit(_hook_seconds(), f"{hook} of {info.describe()}"):
                        result = impl.function()
                        items = _records_of(result, hook)
                except ValidationError as exc:
                    return [], PluginProblem(info, stage, _format_validation(exc, hook) + _where(exc, info, plugin))
                except NotRecords as exc:
                    return [], PluginProblem(info, stage, f"{exc}{_defined_at(impl.function)}")
                except Exception as exc:
                    return [], PluginProblem(info, stage, _failure(exc, info, plugin))
                for item, at in items:
                    if isinstance(item, record_type):
                        out.append(item)
                        continue
                    what = (
                        f"a {type(item).__name__}, the record of another hook"
                        if isinstance(item, BaseModel) else f"{type(item).__name__} {_bounded(item)}"
                    )
                    return [], PluginProblem(
                        info,
                        stage,
                        f"yielded {what}; {hook} yields edgeplug.plugin.{record_type.__name__} records only"
                        + (" (a dict is not converted: build the record)" if isinstance(item, dict) else "")
                        + (at or _defined_at(impl.function)),
                    )
        return out, None

    @staticmethod
    def _check(state: _Loaded) -> None:
        """Conflicts make their backend unavailable; records for no registered backend are set aside."""
        specs: dict[str, Contribution] = {}
        for c in state.contributions:
            if not isinstance(c.record, BackendSpec):
                continue
            first = specs.get(c.record.backend)
            if first is None:
                specs[c.record.backend] = c
            elif c.record.backend not in state.conflicts:
                state.conflicts[c.record.backend] = BackendProblem(
                    c.record.backend,
                    f"backend {c.record.backend!r} is registered twice: by {_who(first.plugin)} and by "
                    f"{_who(c.plugin)}",
                    (first.plugin, c.plugin),
                )
        registered = tuple(sorted(specs))
        keep: list[Contribution] = []
        for c in state.contributions:
            if c.record.backend in specs:
                keep.append(c)
            else:
                state.unclaimed.append(UnclaimedRecord(c, registered))
        state.contributions = keep
        seen: dict[tuple, Contribution] = {}
        for c in keep:
            rec, key, what = c.record, None, ""
            if isinstance(rec, Kernel):
                key = ("kernel", rec.backend, rec.op, rec.device)
                what = f"two kernels for op {rec.op!r} on backend {rec.backend!r} ({rec.device})"
            elif isinstance(rec, FusionPolicy):
                pattern = getattr(rec, "pattern", "")
                key = ("policy", rec.backend, pattern)
                what = f"two fusion policies for pattern {pattern!r} on backend {rec.backend!r}"
            elif isinstance(rec, PassSpec):
                key = ("pass", rec.backend, rec.name)
                what = f"two passes named {rec.name!r} on backend {rec.backend!r}"
            elif isinstance(rec, QuantScheme):
                key = ("scheme", rec.backend, rec.scheme)
                what = f"two quantization schemes named {rec.scheme!r} on backend {rec.backend!r}"
            if key is None:
                continue
            first = seen.setdefault(key, c)
            if first is not c and rec.backend not in state.conflicts:
                state.conflicts[rec.backend] = BackendProblem(
                    rec.backend, f"{what}: from {_who(first.plugin)} and from {_who(c.plugin)}", (first.plugin, c.plugin)
                )
        for c in keep:
            problem = _policy_problem(c) if isinstance(c.record, FusionPolicy) else None
            if problem is not None and c.record.backend not in state.conflicts:
                state.conflicts[c.record.backend] = BackendProblem(c.record.backend, problem, (c.plugin,))
        for name in specs:
            if name in state.conflicts:
                continue
            passes = [c for c in keep if isinstance(c.record, PassSpec) and c.record.backend == name]
            try:
                state.pass_order[name] = tuple(c.record for c in order_passes(passes))
            except ValueError as exc:
                state.conflicts[name] = BackendProblem(name, str(exc), tuple(dict.fromkeys(c.plugin for c in passes)))

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


def summaries() -> list[PluginSummary]:
    """Every plugin found: loaded (with its contributions per backend), broken (with why), blocked."""
    m = _manager
    state = m._state()
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
                trouble[backend] = f"added to a backend of {_who(owner)}"
            conflict = state.conflicts.get(backend)
            if conflict is not None:
                trouble[backend] = conflict.message
        for u in state.unclaimed:
            if u.contribution.plugin == info:
                backend = u.contribution.record.backend
                contributes.setdefault(backend, []).append(describe_record(u.contribution.record))
                trouble[backend] = "ignored: " + u.message
        out.append(PluginSummary(info, "loaded", "", contributes, trouble))
    for problem in state.problems:
        out.append(PluginSummary(problem.plugin, "broken", f"failed at {problem.stage}: {problem.cause}"))
    for info, why in state.skipped:
        out.append(PluginSummary(info, "blocked", why))
    return sorted(out, key=lambda s: (_normalize(s.plugin.name), s.plugin.distribution))


_manager = PluginManager()


def manager() -> PluginManager:
    return _manager


def register(plugin: object, name: Optional[str] = None) -> PluginInfo:
    """Register a module of hookimpls (for tests and embedding)."""
    return _manager.register(plugin, name)


def unregister(plugin_or_name: object) -> None:
    """Remove a plugin registered in-process with ``register`` (given by the object or its name)."""
    _manager.unregister(plugin_or_name)


def reset() -> None:
    _manager.reset()


def problems() -> list[PluginProblem]:
    """Plugins that were dropped (failed import, raising hook, invalid record)."""
    return _manager.problems()


def skipped() -> list[tuple[PluginInfo, str]]:
    """Plugins not loaded because of EDGEPLUG_DISABLE_PLUGINS / EDGEPLUG_PLUGINS, and why."""
    return _manager.skipped()


def conflicts() -> list[BackendProblem]:
    """Backends made unavailable by contributions that contradict each other (both plugins named)."""
    return _manager.conflicts()


def unclaimed() -> list[UnclaimedRecord]:
    """Records for a backend no loaded plugin registers (ignored)."""
    return _manager.unclaimed()
