"""Where a plugin's own code is, and where in it an exception was raised: what every error that blames a
plugin names (``raised_at``; ``plugin_location`` for errors raised while lowering).

It sits beside the records, below the graph, the registry and the pass runner, which all name a plugin's
line; a plugin is described by its ``PluginInfo`` (``edgeplug._registry.info``), read here by its fields.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import traceback
from importlib.metadata import distribution
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # its fields only
    from edgeplug._registry.info import PluginInfo


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
            for f in distribution(info.distribution).files or ():
                if str(f).endswith(".py"):
                    files.add(str(Path(f.locate()).resolve()))
        except Exception:  # no metadata to read: the module below still locates it
            pass
    tops = {t for t in (package_of(info), package_of(info, plugin) if plugin is not None else None) if t}
    for top in tops:
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


def raised_at(exc: BaseException, info: PluginInfo, plugin: object = None) -> str:
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
        return f" (no frame of the plugin's code in the traceback; registered as {package_of(info, plugin) or info.name!r})"
    target = str(info.entry_point).split("=", 1)[-1].split(":", 1)[0].strip()
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if missing and target and (target == missing or target.startswith(missing + ".")):
        return (
            f" (its entry point '{info.entry_point}' names a module that cannot be imported: check "
            "[project.entry-points.edgeplug] in the plugin's pyproject.toml, and that its package is installed)"
        )
    return f" (no frame of the plugin's code in the traceback; its entry point is '{info.entry_point}')"


def plugin_location(exc: BaseException, info: PluginInfo) -> str:
    """' (raised at FILE:LINE in FUNC)': where in the plugin's own code ``exc`` was raised (or its entry point)."""
    return raised_at(exc, info)


def package_of(info: PluginInfo, plugin: object = None) -> Optional[str]:
    """The plugin's top-level module name, from its entry point or its object."""
    if plugin is not None:
        name = getattr(plugin, "__name__", None) if inspect.ismodule(plugin) else type(plugin).__module__
        return (name or "").split(".")[0] or None
    value = info.entry_point.partition("=")[2].strip()
    return value.split(":")[0].split(".")[0] or None


__all__ = ["package_of", "plugin_location", "raised_at"]
