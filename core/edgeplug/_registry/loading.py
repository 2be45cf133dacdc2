"""Discovery and loading: entry points, the enable/disable variables, importing, collecting records.

Every failure here is a ``PluginProblem`` that names the plugin's own file
and line where Python can find it (``raised_at``); the plugin is dropped
whole and the others load.
"""

from __future__ import annotations

import importlib
import inspect
import os
import signal
import threading
from importlib.metadata import entry_points
from typing import Any, Optional

import pluggy
from pydantic import BaseModel, ValidationError

from edgeplug import _api
from edgeplug import _hookspecs as hookspecs
from edgeplug._plugin_code import raised_at
from edgeplug._records import HOOK_RECORDS
from edgeplug._registry.info import (
    ENTRY_POINT_GROUP,
    ENV_ALLOW,
    ENV_DISABLE,
    ENV_REGISTER,
    NAMED_IN_ENV,
    Contribution,
    Loaded,
    PluginInfo,
    PluginProblem,
    name_set,
    normalize_name,
)

def format_validation(err: ValidationError, hook: str = "") -> str:
    """'invalid X record from hook H: field F = VALUE (why)': every field pydantic rejected, with its value."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "record"
        value = e.get("input")
        shown = "" if isinstance(value, dict) and e["loc"] == () else f" = {bounded(value)}"
        parts.append(f"field {loc!r}{shown}: {e['msg']}")
    source = f" from hook {hook}" if hook else ""
    return f"invalid {err.title} record{source}: {'; '.join(parts)}"


def bounded(value: Any, width: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def failure(exc: BaseException, info: PluginInfo, plugin: object = None) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}{raised_at(exc, info, plugin)}" if text else f"{type(exc).__name__}{raised_at(exc, info, plugin)}"


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
            f"returned {type(result).__name__} {bounded(result)}; {hook} must yield records "
            "(or return a list of them, or None)"
        )
    if not inspect.isgenerator(result):
        return [(item, "") for item in result]
    out = []
    for item in result:
        frame = result.gi_frame
        out.append((item, f" (yielded at {frame.f_code.co_filename}:{frame.f_lineno})" if frame is not None else ""))
    return out


def _hook_body_at(fn: Any) -> str:
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
    """A plugin's code ran past its time limit (see ``time_limit``)."""


def _importing(frame: Any) -> bool:
    """Whether ``frame`` (or a caller of it) is executing a module's import."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


class time_limit:
    """Interrupt the block after ``seconds`` with ``TimeLimit`` (SIGALRM; main thread only).

    Where no alarm can be set (another thread, a platform without SIGALRM,
    an alarm handler the application installed) the block runs unlimited.
    An import in progress is never interrupted: the limit takes effect when
    it returns.
    """

    def __init__(self, seconds: float, what: str) -> None:
        self.seconds, self.what, self.armed = seconds, what, False
        self.previous: Any = None  # the alarm handler in place before, put back on exit

    def __enter__(self) -> "time_limit":
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
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous if self.previous is not None else signal.SIG_DFL)



def _entry_points() -> list[Any]:
    return sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)


def unmarked_hook(plugin: object, pm: pluggy.PluginManager) -> Optional[str]:
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


def _old_hookspecs() -> type:
    """Hook specs under the previous API's hook names (``edgeplug._api.RENAMES``), so a plugin's old
    hook registers; ``collect`` calls it as the new hook (deprecated) or notes it (removed)."""
    marker = pluggy.HookspecMarker(hookspecs.PROJECT)
    return type("OldHooks", (), {old: staticmethod(marker(lambda: None)) for old in _api.hook_renames()})


def collect(plugin: object, info: PluginInfo) -> tuple[list[BaseModel], Optional[PluginProblem]]:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.add_hookspecs(_old_hookspecs())
    try:
        pm.register(plugin, name=info.name)
        pm.check_pending()  # a misspelt hook would otherwise be ignored silently
    except Exception as exc:  # e.g. a hookimpl with an unknown name or argument
        known = ", ".join(HOOK_RECORDS)
        return [], PluginProblem(
            info, "registration", f"{type(exc).__name__}: {exc} (the hooks are: {known})"
        )
    unmarked = unmarked_hook(plugin, pm)
    if unmarked is not None:
        return [], PluginProblem(info, "registration", unmarked)
    out: list[BaseModel] = []
    old_hooks = [(old, r) for old, r in _api.hook_renames().items()]
    for hook, record_type in [*HOOK_RECORDS.items(), *((old, HOOK_RECORDS[r.new]) for old, r in old_hooks)]:
        caller = getattr(pm.hook, hook, None)
        for impl in caller.get_hookimpls() if caller is not None else ():
            stage = f"hook {hook}"
            if hook not in HOOK_RECORDS:
                _api.used(hook)  # the previous API's name of a hook: warned (its records count) or noted
            try:
                with time_limit(_hook_seconds(), f"{hook} of {info.describe()}"):
                    result = impl.function()
                    items = _records_of(result, hook)
            except ValidationError as exc:
                return [], PluginProblem(info, stage, format_validation(exc, hook) + raised_at(exc, info, plugin))
            except NotRecords as exc:
                return [], PluginProblem(info, stage, f"{exc}{_hook_body_at(impl.function)}")
            except Exception as exc:
                return [], PluginProblem(info, stage, failure(exc, info, plugin))
            for item, at in items:
                if isinstance(item, record_type):
                    out.append(item)
                    continue
                what = (
                    f"a {type(item).__name__}, the record of another hook"
                    if isinstance(item, BaseModel) else f"{type(item).__name__} {bounded(item)}"
                )
                return [], PluginProblem(
                    info,
                    stage,
                    f"yielded {what}; {hook} yields edgeplug.plugin.{record_type.__name__} records only"
                    + (" (a dict is not converted: build the record)" if isinstance(item, dict) else "")
                    + (at or _hook_body_at(impl.function)),
                )
    return out, None


def named_in_env(value: Optional[str]) -> list[PluginInfo]:
    """The plugins ``ENV_REGISTER`` names (``MODULE`` or ``MODULE:OBJECT``, comma-separated), in its order."""
    out: list[PluginInfo] = []
    for entry in (value or "").split(","):
        entry = entry.strip()
        if entry and entry not in [i.name for i in out]:
            out.append(PluginInfo(entry, NAMED_IN_ENV, "", f"{ENV_REGISTER}={entry}"))
    return out


class NamedNotFound(ImportError):
    """An ``ENV_REGISTER`` entry that is malformed or names nothing importable (the message says what to fix)."""


def import_named(info: PluginInfo) -> object:
    """The module (or its ``OBJECT``) an ``ENV_REGISTER`` entry names; ``NamedNotFound`` saying what to fix.

    An error raised by the module's own code propagates as it is (it is located in that code)."""
    module_name, colon, attr = info.name.partition(":")
    if not all(p.isidentifier() for p in module_name.split(".")) or (
        colon and not all(p.isidentifier() for p in attr.split("."))
    ):
        raise NamedNotFound(
            f"{ENV_REGISTER} entry {info.name!r} is not MODULE or MODULE:OBJECT (dotted Python names, "
            f"comma-separated): fix the variable"
        )
    try:
        obj: object = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise  # the module exists; something it imports does not (located by the caller)
        raise NamedNotFound(
            f"{ENV_REGISTER} names module {module_name!r}, which this Python cannot find ({exc}): install it, "
            f"or put the folder that holds it on PYTHONPATH (a process started with this environment must "
            f"find it too)"
        ) from None
    for part in attr.split(".") if attr else ():
        if not hasattr(obj, part):
            raise NamedNotFound(
                f"{ENV_REGISTER} entry {info.name!r}: module {module_name!r} has no attribute {attr!r}: fix the "
                "OBJECT after the colon, or leave it out to register the module itself"
            )
        obj = getattr(obj, part)
    return obj


def load(
    registered: list[tuple[object, PluginInfo]],
    disable: Optional[str],
    allow: Optional[str],
    named: Optional[str] = None,
) -> Loaded:
    """Find, filter, import and collect every plugin (not yet validated against each other).

    ``named``: the value of ``ENV_REGISTER``. Its plugins load like registered ones (explicit:
    ``allow`` does not filter them; ``disable`` does); one that is also registered in-process
    (the same object) loads once."""
    state = Loaded()
    candidates = [
        *_entry_point_plugins(state, disable, allow),
        *_registered(state, registered, disable),
        *_named(state, named, registered, disable),
    ]
    for obj, info, is_ep in candidates:
        _collect_one(state, obj, info, is_ep)
    return state


#: (an entry point or a plugin object, what it is, whether it is an entry point still to load)
_Candidate = tuple[Any, PluginInfo, bool]


def _entry_point_plugins(state: Loaded, disable: Optional[str], allow: Optional[str]) -> list[_Candidate]:
    """The installed plugins (entry points) that ``disable`` and ``allow`` let through; the others skipped."""
    blocked, allowed = name_set(disable) or set(), name_set(allow)
    out: list[_Candidate] = []
    for ep in _entry_points():
        dist = getattr(ep, "dist", None)
        info = PluginInfo(
            name=ep.name,
            distribution=getattr(dist, "name", None) or "<unknown>",
            version=getattr(dist, "version", None) or "",
            entry_point=f"{ep.name} = {ep.value}",
        )
        names = {normalize_name(info.name), normalize_name(info.distribution)}
        if names & blocked:
            state.skipped.append((info, f"blocked by {ENV_DISABLE}={disable}"))
        elif allowed is not None and not names & allowed:
            state.skipped.append((info, f"not in {ENV_ALLOW}={allow}"))
        else:
            out.append((ep, info, True))
    return out


def _registered(state: Loaded, registered: list[tuple[object, PluginInfo]], disable: Optional[str]) -> list[_Candidate]:
    """The plugins registered in this process that ``disable`` does not block."""
    blocked = name_set(disable) or set()
    out: list[_Candidate] = []
    for module, info in registered:
        if normalize_name(info.name) in blocked:
            state.skipped.append((info, f"blocked by {ENV_DISABLE}={disable}"))
        else:
            out.append((module, info, False))
    return out


def _named(
    state: Loaded, named: Optional[str], registered: list[tuple[object, PluginInfo]], disable: Optional[str]
) -> list[_Candidate]:
    """The plugins ``ENV_REGISTER`` names, imported; one registered in-process already is left to that."""
    blocked = name_set(disable) or set()
    in_process = [id(module) for module, _ in registered]
    out: list[_Candidate] = []
    for info in named_in_env(named):
        module_name = info.name.partition(":")[0]
        if {normalize_name(info.name), normalize_name(module_name)} & blocked:
            state.skipped.append((info, f"blocked by {ENV_DISABLE}={disable}"))
            continue
        try:
            with _api.watching(info) as usage:  # its import's old spellings are its own, as an entry point's are
                obj = import_named(info)
            state.imported[info] = usage
        except NamedNotFound as exc:
            state.problems.append(PluginProblem(info, "import", str(exc)))
            continue
        except Exception as exc:
            state.problems.append(PluginProblem(info, "import", failure(exc, info)))
            continue
        if id(obj) in in_process:
            continue  # registered in this process already: its records are collected once
        in_process.append(id(obj))
        out.append((obj, info, False))
    return out


def _collect_one(state: Loaded, obj: Any, info: PluginInfo, is_ep: bool) -> None:
    """Load one candidate (an entry point), collect its records and check its plugin API; into ``state``."""
    with _api.watching(info, state.imported.get(info)) as usage:  # the previous API's spellings it imports or writes
        if is_ep:
            try:
                obj = obj.load()
            except Exception as exc:  # a broken plugin must not break the others
                state.problems.append(PluginProblem(info, "import", failure(exc, info)))
                return
        records, problem = collect(obj, info)
    if problem is not None:
        state.problems.append(problem)
        return
    wanted, where = _api.wanted_api(info, records)
    reasons = [_api.contradiction(info, records) or (_api.refusal(wanted, where) if wanted is not None else None)]
    if usage.removed:  # each replacement named, with or without a version refusal
        reasons.append(_api.removed_message(usage))
    refused = "; ".join(r for r in reasons if r)
    if refused:
        state.problems.append(PluginProblem(info, "the plugin API check", refused))
        return
    state.api[info] = (wanted if wanted is not None else _api.current, usage.deprecated)
    state.plugins.append(info)
    state.contributions.extend(Contribution(info, r) for r in records)
