"""The public surfaces: ``edgeplug`` (users), ``edgeplug.plugin`` (backend authors) and ``edgeplug.testing``
with its submodules (what backend authors test with).

Everything else in the core may change without notice, so first-party plugins
import from ``edgeplug`` and ``edgeplug.plugin`` only, and a change to any surface is made on
purpose: the snapshot below must be updated with it.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import difflib
import inspect
import os
import re
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLIC_MODULES = ("edgeplug", "edgeplug.plugin")
#: what plugin authors' tests import: the helpers, the conformance suite, the fault plugins, the programs
TESTING_MODULES = (
    "edgeplug.testing",
    "edgeplug.testing.conformance",
    "edgeplug.testing.faults",
    "edgeplug.testing.programs",
    "edgeplug.testing.rewrites",
    "edgeplug.testing.rms_norm_cases",
)
SNAPSHOT_MODULES = PUBLIC_MODULES + TESTING_MODULES


def _plugin_sources() -> list[Path]:
    return sorted(p for p in (ROOT / "plugins").glob("*/edgeplug_*/**/*.py"))


def _private_imports(path: Path, root: Path = ROOT, *, source: str = "", allowed: tuple[str, ...] = ()) -> list[str]:
    """``file:line: module`` for each import of an edgeplug module other than the two public ones
    (and the packages in ``allowed``, with their submodules)."""
    tree = ast.parse(source or path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
            if node.module == "edgeplug":  # `from edgeplug import _registry as plugins` imports a module too
                modules += [f"edgeplug.{a.name}" for a in node.names if (a.name[:1].islower() or a.name[:1] == "_") and a.name != "hookimpl"]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        else:
            continue
        for module in modules:
            ours = module == "edgeplug" or module.startswith("edgeplug.")
            if ours and module not in PUBLIC_MODULES and not any(module == a or module.startswith(a + ".") for a in allowed):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {module}")
    return found


def test_first_party_plugins_import_only_the_public_surfaces():
    sources = _plugin_sources()
    assert len(sources) >= 10, f"found only {len(sources)} plugin sources under plugins/*/edgeplug_*/"
    bad = [hit for path in sources for hit in _private_imports(path)]
    assert not bad, (
        "first-party plugins import core modules that are not public; import these names from "
        "edgeplug.plugin (add them to its __all__ and docstring if they belong to the author's surface):\n  "
        + "\n  ".join(bad)
    )


@pytest.mark.parametrize("doc", ["README.md", "docs/writing-a-backend.md"])
def test_the_docs_examples_import_only_the_public_surfaces(doc):
    """What the docs show is what authors copy: records and helpers come from edgeplug.plugin."""
    path = ROOT / doc
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), re.S)
    assert blocks, f"{doc} has no python example"
    # the conformance suite and the example models are packages of their own, documented as such
    allowed = ("edgeplug.testing", "edgeplug.examples")
    bad = [hit for block in blocks for hit in _private_imports(path, ROOT, source=block, allowed=allowed)]
    assert not bad, f"{doc}'s examples import internal modules (line numbers within each block): {bad}"


def test_the_import_check_sees_private_imports(tmp_path):
    src = tmp_path / "hooks.py"
    src.write_text(
        "import edgeplug\nfrom edgeplug.plugin import BackendSpec\nfrom edgeplug import plugin, hookimpl\n"
        "from edgeplug._graph.canonical import rewrite_pass\nimport edgeplug._partition.verdict\n"
        "from edgeplug import _registry as plugins\n"
    )
    hits = [h.split(": ", 1)[1] for h in _private_imports(src, tmp_path)]
    assert hits == ["edgeplug._graph.canonical", "edgeplug._partition.verdict", "edgeplug._registry"]


def test_importing_the_author_surface_loads_neither_torch_nor_executorch():
    code = (
        "import sys, edgeplug.plugin\n"
        "heavy = sorted(m for m in ('torch', 'executorch', 'wgpu') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import edgeplug.plugin loaded {out.stdout.strip()}: keep those names lazy"


def test_an_unknown_author_name_says_where_the_surface_is_listed():
    import edgeplug.plugin

    with pytest.raises(AttributeError, match=r"edgeplug\.plugin\.__all__"):
        edgeplug.plugin.CorePartitioner  # noqa: B018  (internal: not on the author's surface)


# -- the snapshot of both surfaces ------------------------------------------------------

SNAPSHOT = Path(__file__).resolve().parent / "public_surface.txt"
UPDATE = "EDGEPLUG_UPDATE_SURFACE"
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _signature(obj: Any) -> str:
    try:
        return _ADDRESS.sub("", str(inspect.signature(obj)))
    except (TypeError, ValueError):
        return "(...)"


def _members(cls: type) -> list[str]:
    """The public attributes a class of the project defines (not those of pydantic, Exception or object)."""
    fields = set(getattr(cls, "model_fields", {})) | {"model_config"}
    if dataclasses.is_dataclass(cls):
        fields |= {f.name for f in dataclasses.fields(cls)}  # in the signature already
    out = []
    for name in sorted({n for c in cls.__mro__ if c.__module__.startswith("edgeplug") for n in vars(c)}):
        if name.startswith("_") or name in fields:
            continue
        value = inspect.getattr_static(cls, name)
        if isinstance(value, property):
            out.append(f"    .{name}: property")
        elif isinstance(value, (staticmethod, classmethod)) or inspect.isfunction(value):
            out.append(f"    .{name}{_signature(getattr(cls, name))}")
        else:
            out.append(f"    .{name}: {type(value).__name__}")
    return out


def _describe(module: str, name: str, obj: Any) -> list[str]:
    where = f"{module}.{name}"
    if inspect.ismodule(obj):
        own = {
            n: v for n, v in vars(obj).items()
            if not n.startswith("_") and (getattr(v, "__module__", None) == obj.__name__ or (n.isupper() and not callable(v)))
        }
        return [f"{where}: module", *(f"    .{n}" + (f" = {v!r}" if n.isupper() else "") for n, v in sorted(own.items()))]
    if inspect.isclass(obj):
        bases = ", ".join(b.__name__ for b in obj.__bases__)
        return [f"{where}: class({bases}){_signature(obj)}", *_members(obj)]
    if callable(obj):
        return [f"{where}: function{_signature(obj)}"]
    text = _ADDRESS.sub("", repr(obj))
    if isinstance(obj, (tuple, list)) and len(text) > 120:  # a catalogue of cases: its size and kinds
        kinds = "|".join(sorted({type(v).__name__ for v in obj}))
        return [f"{where}: {type(obj).__name__} of {len(obj)} {kinds}"]
    return [f"{where}: {type(obj).__name__} = {text}"]


def _surface() -> list[str]:
    import importlib

    lines = []
    for module in SNAPSHOT_MODULES:
        mod = importlib.import_module(module)
        for name in sorted(mod.__all__):
            lines += _describe(module, name, getattr(mod, name))
    return lines


def test_the_surfaces_match_the_checked_in_snapshot():
    now = _surface()
    if os.environ.get(UPDATE):
        SNAPSHOT.write_text("\n".join(now) + "\n")
    assert SNAPSHOT.is_file(), f"{SNAPSHOT.name} is missing: run {UPDATE}=1 pytest tests/test_public_surface.py"
    before = SNAPSHOT.read_text().splitlines()
    diff = "\n".join(difflib.unified_diff(before, now, "tests/public_surface.txt", "the code now", lineterm=""))
    assert now == before, (
        f"the public surface changed (the __all__ of {', '.join(SNAPSHOT_MODULES)}, a signature, a member):\n"
        f"{diff}\n"
        "If the change is deliberate, document the name in its module's docstring, then update the snapshot with "
        f"`{UPDATE}=1 pytest tests/test_public_surface.py` and commit tests/public_surface.txt with the change."
    )


def test_every_public_testing_module_is_in_the_snapshot():
    """A new public submodule of edgeplug.testing joins the snapshot (and declares its names in ``__all__``).

    ``edgeplug.testing.plugin`` is the pytest plugin: authors use its fixtures by name, documented in
    ``edgeplug.testing``, and never import it."""
    import importlib
    import pkgutil

    import edgeplug.testing

    found = {
        f"edgeplug.testing.{m.name}" for m in pkgutil.iter_modules(edgeplug.testing.__path__) if not m.name.startswith("_")
    }
    missing = sorted(found - set(TESTING_MODULES) - {"edgeplug.testing.plugin"})
    assert not missing, f"public modules of edgeplug.testing outside TESTING_MODULES (add them, or make them _private): {missing}"
    no_all = [m for m in TESTING_MODULES if not hasattr(importlib.import_module(m), "__all__")]
    assert not no_all, f"these modules of the testing surface have no __all__: {no_all}"


@pytest.mark.parametrize("module", SNAPSHOT_MODULES)
def test_every_public_name_is_documented(module):
    import importlib

    mod = importlib.import_module(module)
    assert len(mod.__all__) == len(set(mod.__all__)), f"{module}.__all__ names something twice"
    missing, undocumented = [], []
    for name in mod.__all__:
        obj = getattr(mod, name)
        if f"``{name}``" not in mod.__doc__:
            missing.append(name)
        if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj):
            own = vars(obj).get("__doc__") if inspect.isclass(obj) else obj.__doc__
            if not (own or "").strip() or (inspect.isclass(obj) and own.startswith(f"{name}(")):  # a dataclass's generated doc
                undocumented.append(name)
    assert not missing, f"{module}'s docstring does not name {missing}: add a line for each"
    assert not undocumented, f"these names of {module} have no docstring of their own: {undocumented}"


def test_a_deprecation_warning_from_edgeplug_fails_the_tests():
    """pyproject quiets the dependencies' deprecations, not ours: a deprecated path in edgeplug is an error."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    filters = config["tool"]["pytest"]["ini_options"]["filterwarnings"]
    with warnings.catch_warnings():
        warnings.resetwarnings()
        for spec in filters:  # pytest applies them in order, each over the ones before
            action, message, category, module = (spec.split(":") + ["", "", "", ""])[:4]
            warnings.filterwarnings(action, message, getattr(builtins, category or "Warning"), module)
        for module in ("edgeplug._pipeline", "edgeplug_fixture_backends"):  # the core, a plugin
            with pytest.raises(DeprecationWarning):
                warnings.warn_explicit("old", DeprecationWarning, "x.py", 1, module=module)
        warnings.warn_explicit("old", DeprecationWarning, "x.py", 1, module="torch.export")  # quiet
