"""The plugin API's version, and every spelling it renamed: the one table of renames.

A plugin states the API it was written for: ``BackendSpec.api_version``, or
its distribution's requirement on ``edgeplug`` (``edgeplug>=0.1,<0.2``: API
*n* is what ``edgeplug 0.n`` speaks). The registry then

- loads a plugin of this API or the one before it; a spelling of the one
  before (``RENAMES``) works with a ``PluginApiDeprecationWarning`` naming
  the new spelling and the release that removes it, once per plugin and
  spelling (not per node);
- refuses a plugin that wants an older or a newer API, in one line: the
  plugin, the API it wants, the API installed, and what to do.

The warning is a ``DeprecationWarning``: pytest shows it, and so does every
``edgeplug`` command (the CLI adds the filter when it runs); a script shows
it as Python shows deprecations (``-W default``). Importing edgeplug adds no
warnings filter and no import hook: each old module path is a module of its
own (``old_path``).

Once a rename's ``removed_in`` is reached, the old spelling fails with a
message naming the replacement (an import raises ``ImportError``; a plugin
that uses it is refused, its line naming each replacement).

``RENAMES`` is the only list of renames: ``docs/plugin-api-changes.md`` is
generated from it (``changelog()``, checked by plugins/xnnpack/tests/test_plugin_api_old_spellings.py), and
the public-surface snapshot test asks for an entry here for every name a
breaking change removes.
"""

from __future__ import annotations

import importlib
import sys
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, requires
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Optional

#: The plugin API version this core speaks (``BackendSpec.api_version``).
API_VERSION = 1
#: The core's API as the checks below read it: ``API_VERSION``, except in a test
#: that simulates the next release (it sets this before any plugin loads).
current = API_VERSION


def release(api: int) -> str:
    """The edgeplug release that speaks plugin API ``api``: API n is edgeplug 0.n."""
    return f"0.{api}"


def accepted() -> tuple[int, int]:
    """(oldest, newest) API a plugin may want: this one, and the one before it with deprecation warnings."""
    return max(current - 1, 0), current


class PluginApiDeprecationWarning(DeprecationWarning):
    """A plugin uses a spelling of the previous plugin API; the message names the new one and when the old goes."""


@dataclass(frozen=True)
class Rename:
    """One spelling the plugin API changed: ``old`` works (deprecated) from ``since`` until ``removed_in``."""

    #: "field" (a record's keyword), "hook" (a hook function's name), "import" (a module path and name),
    #: "model" (a command's model name: ``edgeplug lower llama``)
    kind: Literal["field", "hook", "import", "model"]
    old: str
    new: str
    #: the API whose spelling is ``new`` (``old`` is deprecated from here)
    since: int
    #: the API that no longer accepts ``old``
    removed_in: int
    #: why ``old`` goes, where the new spelling alone does not say it (a model name another command uses)
    why: str = ""

    @property
    def removed(self) -> bool:
        return current >= self.removed_in

    def sentence(self) -> str:
        """'`old` is now `new`' with the releases, as warnings, errors and the changelog say it."""
        when = (
            f"removed in plugin API {self.removed_in}, edgeplug {release(self.removed_in)}"
            if self.removed
            else f"deprecated in plugin API {self.since}, edgeplug {release(self.since)}; "
            f"removed in API {self.removed_in}, edgeplug {release(self.removed_in)}"
        )
        return f"`{self.old}` is now `{self.new}` ({when})"

    def model_notice(self) -> str:
        """A command's model name (kind "model"), in one line: what it names, why it goes, and when."""
        command, _, old = self.old.rpartition(" ")
        new = self.new.rpartition(" ")[2]
        because = f" because {self.why}" if self.why else ""
        if self.removed:
            return (
                f"`{old}` in `{command}` was `{new}`; the short name was removed in plugin API {self.removed_in} "
                f"(edgeplug {release(self.removed_in)}){because}: write `{command} {new}`"
            )
        return f"`{old}` in `{command}` is `{new}`; the short name is deprecated{because}, and goes in edgeplug {release(self.removed_in)}"


def _moved(old_module: str, new_module: str, names: str) -> tuple[Rename, ...]:
    return tuple(Rename("import", f"{old_module}.{n}", f"{new_module}.{n}", 1, 2) for n in names.split())


#: Every rename of the plugin API, oldest first (API 0: the spellings before
#: the boundary redesign made every core module but ``edgeplug``,
#: ``edgeplug.plugin`` and ``edgeplug.testing`` private).
RENAMES: tuple[Rename, ...] = (
    Rename("field", "BackendSpec(verify=)", "BackendSpec(verify_method=)", 1, 2),
    Rename("hook", "edgeplug_skip_decomp", "edgeplug_keep_whole", 1, 2),
    Rename("import", "edgeplug.records.SkipDecomp", "edgeplug.plugin.KeepWhole", 1, 2),
    *_moved(
        "edgeplug.records",
        "edgeplug.plugin",
        "API_VERSION Availability BackendSpec FusionPolicy FusionRecord KeepWhole Kernel PartitionerFilter "
        "PassSpec QuantScheme TransformRecord",
    ),
    Rename("import", "edgeplug.hookspecs.hookimpl", "edgeplug.plugin.hookimpl", 1, 2),
    *_moved("edgeplug.partition", "edgeplug.plugin", "FilterContext SupportTablePartitioner TAKEN Verdict op_name refuse"),
    *_moved("edgeplug.partition.verdict", "edgeplug.plugin", "FilterContext TAKEN Verdict refuse"),
    *_moved("edgeplug.partition.table", "edgeplug.plugin", "SupportTablePartitioner"),
    *_moved("edgeplug.graph.ops", "edgeplug.plugin", "aten_overload is_qdq op_name qualified_name"),
    *_moved(
        "edgeplug.graph.rewrite",
        "edgeplug.plugin",
        "NodeBuilder calls_to is_plain is_static note_rewrite replace_with_traced tensor_of",
    ),
    *_moved("edgeplug.graph.canonical", "edgeplug.plugin", "FLOATS rewrite_pass"),
    *_moved("edgeplug.runtime.host", "edgeplug.plugin", "OpCall"),
    *_moved("edgeplug.runtime.device", "edgeplug.plugin", "GpuDevice"),
    *_moved(
        "edgeplug.errors",
        "edgeplug",
        "BackendUnavailableError EdgeplugError KernelError LoweringError OutputPathError PassError "
        "PluginConflictError QuantizationError UnknownBackendError VerificationError",
    ),
    Rename("import", "edgeplug.plugins.register", "edgeplug.register_plugin", 1, 2),
    Rename("import", "edgeplug.plugins.unregister", "edgeplug.unregister_plugin", 1, 2),
    Rename("import", "edgeplug.plugins.problems", "edgeplug.plugin_problems", 1, 2),
    # the hand-written decoder's short name: `edgeplug zoo`'s `llama` is transformers' LlamaForCausalLM
    # (edgeplug._models.PUBLIC_NAME_CLASHES), and the zoo keeps it (its cell records and pages are keyed by it)
    Rename(
        "model", "edgeplug lower llama", "edgeplug lower handwritten-llama-decoder", 1, 2,
        why="`edgeplug zoo` names another model by it (transformers-llama)",
    ),
)


def renamed(old: str) -> Optional[Rename]:
    """The rename whose old spelling is ``old`` (e.g. ``'edgeplug.partition.refuse'``), or None."""
    for r in RENAMES:
        if r.old == old:
            return r
    return None


def hook_renames() -> dict[str, Rename]:
    """Old hook name -> its rename (the registry calls such a hook as the new one while it is deprecated)."""
    return {r.old: r for r in RENAMES if r.kind == "hook"}


def field_renames(record: str) -> dict[str, Rename]:
    """A record's old keyword -> its rename, e.g. ``field_renames('BackendSpec')['verify']``."""
    out = {}
    for r in RENAMES:
        if r.kind == "field" and r.old.startswith(f"{record}("):
            out[r.old[len(record) + 1 : -2]] = r
    return out


def model_renames(command: str) -> dict[str, Rename]:
    """A command's deprecated model names -> their renames, e.g. ``model_renames('edgeplug lower')['llama']``
    (whose ``new`` ends in the registry name, ``handwritten-llama-decoder``)."""
    return {r.old.rpartition(" ")[2]: r for r in RENAMES if r.kind == "model" and r.old.rpartition(" ")[0] == command}


def new_field_name(r: Rename) -> str:
    return r.new.split("(", 1)[1][:-2]


# -- who is using an old spelling -------------------------------------------------------


@dataclass
class Usage:
    """The old spellings one plugin used while it loaded (``watching``)."""

    plugin: Any  # the registry's PluginInfo
    deprecated: list[Rename] = field(default_factory=list)
    removed: list[Rename] = field(default_factory=list)


_local = threading.local()
_warned: set[tuple[str, str]] = set()  # (plugin or file:line, old spelling): each warned once per process


@contextmanager
def watching(plugin: Any, usage: Optional[Usage] = None) -> Iterator[Usage]:
    """While a plugin imports and its hooks run: note each old spelling it uses (warned once each); ``usage``
    continues what an earlier watch of the same plugin noted (its import, made before its hooks run)."""
    usage = usage if usage is not None else Usage(plugin)
    before = getattr(_local, "usage", None)
    _local.usage = usage
    try:
        yield usage
    finally:
        _local.usage = before


_CORE = str(Path(__file__).resolve().parent)


def _caller() -> tuple[str, int, str]:
    """(file, line, module) of the first frame outside edgeplug's core, importlib and pydantic."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        module = frame.f_globals.get("__name__", "")
        if not (name.startswith(_CORE) or name.startswith("<frozen") or module.startswith(("pydantic", "importlib"))):
            return name, frame.f_lineno, module
        frame = frame.f_back
    return "<unknown>", 0, "edgeplug"


class RemovedSpelling(ImportError):
    """An old spelling used after its rename's ``removed_in`` (the message names the replacement)."""


def used(old: str) -> None:
    """A plugin used the old spelling ``old``: warn (deprecated) or fail (removed), naming the new one.

    While the registry is ``watching`` a plugin, a removed spelling is noted
    (the plugin is refused once it has loaded, in a line naming every
    replacement) and the new spelling's object is used meanwhile."""
    rename = renamed(old)
    assert rename is not None, f"{old} is not in edgeplug._api.RENAMES"
    usage: Optional[Usage] = getattr(_local, "usage", None)
    who = f"{usage.plugin.describe()}: " if usage is not None else ""
    if rename.removed:
        if usage is None:
            raise RemovedSpelling(f"{rename.sentence()}; write the new spelling (docs/plugin-api-changes.md)")
        if rename not in usage.removed:
            usage.removed.append(rename)
        return
    if usage is not None and rename not in usage.deprecated:
        usage.deprecated.append(rename)
    filename, lineno, module = _caller()
    # once per plugin while it loads; elsewhere once per line of code (a filter reading it per node)
    key = (usage.plugin.name if usage is not None else f"{filename}:{lineno}", old)
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn_explicit(
        f"{who}{rename.sentence()}; write the new spelling (docs/plugin-api-changes.md)",
        PluginApiDeprecationWarning,
        filename,
        lineno,
        module=module,
    )


# -- old module paths ------------------------------------------------------------------


def _old_modules() -> dict[str, dict[str, Rename]]:
    out: dict[str, dict[str, Rename]] = {}
    for r in RENAMES:
        if r.kind == "import":
            module, _, name = r.old.rpartition(".")
            out.setdefault(module, {})[name] = r
    return out


def old_path(module: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the previous API's module path ``module`` (``edgeplug.partition``,
    ``edgeplug.graph.ops``, ...): each name resolves to its new home with a warning the first time, and is
    refused naming the replacement once its rename is removed. Each old path is a file of its own (three
    lines, under ``core/edgeplug``), so that ``import edgeplug`` installs no import hook."""
    moves = _old_modules().get(module, {})

    def __getattr__(name: str) -> Any:
        if name not in moves:
            if name.startswith("__"):
                raise AttributeError(name)
            raise AttributeError(
                f"{module}.{name} is no spelling of any plugin API (this module is the old path of "
                f"{', '.join(sorted(moves)) or 'nothing'}): import from edgeplug.plugin (see its __all__)"
            )
        rename = moves[name]
        used(rename.old)
        new_module, _, new_name = rename.new.rpartition(".")
        # not cached: each plugin that reads it is noted (``used`` warns once per plugin and spelling,
        # so a filter reading it per node warns once)
        return getattr(importlib.import_module(new_module), new_name)

    def __dir__() -> list[str]:
        return sorted(moves)

    return __getattr__, __dir__


def old_paths() -> list[str]:
    """Every module path of the previous API, its parent packages included (``edgeplug.graph``)."""
    out: set[str] = set()
    for module in _old_modules():
        parts = module.split(".")
        out.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
    return sorted(out)


# -- the API a plugin wants ----------------------------------------------------------


def required_api(distribution: str) -> Optional[int]:
    """The plugin API a distribution's requirement on ``edgeplug`` admits, or None if it states none.

    The current API if the requirement admits it; else the newest older one
    it admits; else the oldest newer one (API n is edgeplug 0.n)."""
    found = admitted_apis(distribution)
    if found is None:
        return None
    admitted, _ = found
    if not admitted or current in admitted:
        return current if admitted else None
    older = [n for n in admitted if n < current]
    return max(older) if older else min(admitted)


def admitted_apis(distribution: str) -> Optional[tuple[list[int], str]]:
    """(the plugin APIs a distribution's requirement on ``edgeplug`` admits, the requirement as written), or
    None where it states no version of edgeplug (API n is edgeplug 0.n)."""
    if not distribution or distribution.startswith("<"):
        return None
    try:  # packaging: `import edgeplug` loads this module, and only a plugin's requirement needs it
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:  # pragma: no cover
        return None
    try:
        reqs = requires(distribution) or []
    except PackageNotFoundError:
        return None
    for text in reqs:
        try:
            req = Requirement(text)
        except Exception:
            continue
        if req.name.lower() != "edgeplug" or req.marker is not None or not str(req.specifier):
            continue
        admitted = [
            n for n in range(0, current + 10)
            if any(req.specifier.contains(Version(f"0.{n}.{p}"), prereleases=True) for p in (0, 9999))
        ]
        return admitted, text.strip()
    return None


def contradiction(plugin: Any, records: list[Any]) -> Optional[str]:
    """Why a plugin's two statements of its API disagree (``BackendSpec.api_version`` against its requirement on
    ``edgeplug``), or None: one of them is wrong, and loading it by either would hide that."""
    stated = sorted({
        r.api_version for r in records
        if type(r).__name__ == "BackendSpec" and "api_version" in r.model_fields_set
    })
    found = admitted_apis(getattr(plugin, "distribution", ""))
    if not stated or found is None:
        return None
    admitted, requirement = found
    against = [v for v in stated if v not in admitted]
    if not against:
        return None
    if not admitted:
        admits = "no API"
    elif admitted[-1] >= current + 9:  # as far as it is probed: open-ended
        admits = f"API {admitted[0]} and later"
    else:
        admits = f"API {admitted[0]}-{admitted[-1]}" if len(admitted) > 1 else f"API {admitted[0]}"
    return (
        f"its two statements of the plugin API it was written for disagree: BackendSpec.api_version says "
        f"{against[0]}, its requirement {requirement!r} admits {admits} (API N is edgeplug 0.N). Make them agree: "
        "BackendSpec(api_version=N) with a requirement admitting edgeplug 0.N (API 1: edgeplug>=0.1,<0.2), "
        "or state it in one place only"
    )


def wanted_api(plugin: Any, records: list[Any]) -> tuple[Optional[int], str]:
    """(API, where it was stated) for one plugin: a ``BackendSpec.api_version`` it gave, else its requirement."""
    stated = [
        r.api_version for r in records
        if type(r).__name__ == "BackendSpec" and "api_version" in r.model_fields_set
    ]
    if stated:
        return min(stated), "BackendSpec.api_version"
    api = required_api(getattr(plugin, "distribution", ""))
    return (api, "its requirement on edgeplug") if api is not None else (None, "")


def refusal(wanted: int, where: str) -> Optional[str]:
    """Why a plugin that wants API ``wanted`` is refused (one sentence, saying what to do), or None."""
    oldest, newest = accepted()
    if oldest <= wanted <= newest:
        return None
    speaks = f"this edgeplug speaks plugin API {current} (edgeplug {release(current)}) and accepts API {oldest}-{newest}"
    if wanted > newest:
        todo = (
            f"upgrade edgeplug to {release(wanted)} or later, or install a release of the plugin built for "
            f"API {current}"
        )
    else:
        todo = (
            f"port the plugin to API {current} (docs/plugin-api-changes.md lists each rename), or install "
            f"edgeplug {release(wanted)}"
        )
    return f"it wants plugin API {wanted} ({where}), {speaks}: {todo}"


def removed_message(usage: Usage) -> str:
    """One sentence naming every removed spelling a plugin used, each with its replacement."""
    return (
        f"it uses spellings removed in plugin API {current}: "
        + "; ".join(r.sentence() for r in usage.removed)
        + " (docs/plugin-api-changes.md)"
    )


# -- the authors' changelog ----------------------------------------------------------


def changelog() -> str:
    """docs/plugin-api-changes.md: each API version's renames, as authors read them (generated)."""
    lines = [
        "# Plugin API changes",
        "",
        "<!-- generated from edgeplug._api.RENAMES: regenerate with",
        "     python -c \"import edgeplug._api as a; print(a.changelog(), end='')\" > docs/plugin-api-changes.md -->",
        "",
        f"This edgeplug speaks plugin API {API_VERSION} (edgeplug {release(API_VERSION)}). A plugin states the API it",
        "was written for with `BackendSpec(api_version=...)` or its requirement on `edgeplug`",
        "(`edgeplug>=0.1,<0.2` is API 1). A plugin of the API before loads, with one",
        "`PluginApiDeprecationWarning` per old spelling it uses, naming the new one; a plugin",
        "that wants an older or a newer API is refused in one line saying what to do. An old",
        "spelling is accepted for one release, then fails with a message naming its replacement.",
        "",
    ]
    for since in sorted({r.since for r in RENAMES}, reverse=True):
        rows = [r for r in RENAMES if r.since == since]
        lines += [
            f"## Plugin API {since} (edgeplug {release(since)})",
            "",
            f"The spellings of API {since - 1} below work, deprecated, until API {rows[0].removed_in}.",
            "",
            "| kind | old spelling | new spelling | removed in |",
            "| --- | --- | --- | --- |",
        ]
        for r in rows:
            lines.append(f"| {r.kind} | `{r.old}` | `{r.new}` | API {r.removed_in} (edgeplug {release(r.removed_in)}) |")
        lines.append("")
    return "\n".join(lines)
