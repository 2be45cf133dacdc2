"""The public surfaces: ``edgeplug`` (users), ``edgeplug.plugin`` (backend authors) and ``edgeplug.testing``
with its submodules (what backend authors test with).

Everything else in the core may change without notice, so first-party plugins
import from ``edgeplug.plugin`` only (tests/test_plugins_import_author_surface.py), and a change to any
surface is made on purpose: the snapshot below must be updated with it.
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
    "edgeplug.testing.executorch_suite",
    "edgeplug.testing.faults",
    "edgeplug.testing.programs",
    "edgeplug.testing.rewrites",
    "edgeplug.testing.rms_norm_cases",
)
SNAPSHOT_MODULES = PUBLIC_MODULES + TESTING_MODULES


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


# -- additive or breaking ------------------------------------------------------------------


def _entries(lines: list[str]) -> dict[str, tuple[str, dict[str, str]]]:
    """name -> (its line after 'name: ', {member name: member line}) from snapshot lines."""
    out: dict[str, tuple[str, dict[str, str]]] = {}
    current = None
    for line in lines:
        if line.startswith("    ."):
            member = re.match(r"    \.(\w+)", line).group(1)
            out[current][1][member] = line.strip()
        else:
            current, _, rest = line.partition(": ")
            out[current] = (rest, {})
    return out


def _split(text: str) -> list[str]:
    """Top-level comma-separated parts (brackets and quotes nest)."""
    parts, depth, quote, cur = [], 0, "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        cur += ch
    return [p for p in [*parts, cur.strip()] if p]


def _params(line: str) -> "dict[str, tuple[str, str]] | None":
    """A signature's parameters: name -> (annotation, default); None for a line without one."""
    m = re.search(r"(?:class\([^)]*\)|function|\.\w+)(\(.*\))", line)
    if not m or m.group(1) == "(...)":
        return None
    text = m.group(1)
    depth = 0
    for i, ch in enumerate(text):  # the parenthesis that closes the parameters
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            break
    out = {}
    for part in _split(text[1:i]):
        if part in ("*", "/"):
            continue
        name, _, rest = part.partition(":")
        annotation, _, default = rest.partition(" = ")
        if not rest:
            name, _, default = part.partition("=")
        out[name.strip().lstrip("*")] = (annotation.strip(), default.strip())
    return out


def _literal(annotation: str) -> "set[str] | None":
    m = re.fullmatch(r"(?:typing\.)?Literal\[(.*)\]", annotation)
    return set(_split(m.group(1))) if m else None


def _compare(name: str, before: str, now: str) -> list[tuple[str, str]]:
    """(kind, what) for one line that changed: 'additive' or 'breaking'."""
    old, new = _params(before), _params(now)
    if old is None or new is None:
        size = re.compile(r"^(\w+) of (\d+) ")
        a, b = size.match(before.split(": ", 1)[-1]), size.match(now.split(": ", 1)[-1])
        if a and b and a.group(1) == b.group(1) and int(b.group(2)) >= int(a.group(2)):
            return [("additive", f"{name}: a catalogue grew")]
        return [("breaking", f"{name} changed: {before} -> {now}")]
    found = []
    for p, (annotation, default) in old.items():
        if p not in new:
            found.append(("breaking", f"{name}({p}=) removed"))
            continue
        annotation2, default2 = new[p]
        if annotation2 != annotation:
            widened = _literal(annotation) is not None and _literal(annotation) <= (_literal(annotation2) or set())
            found.append(("additive" if widened else "breaking", f"{name}({p}=): {annotation} -> {annotation2}"))
        if default2 != default:
            found.append(("breaking", f"{name}({p}=) default {default or 'none'} -> {default2 or 'none'}"))
    for p, (_, default) in new.items():
        if p not in old:
            found.append(("additive" if default else "breaking", f"{name}({p}=) added" + ("" if default else ", required")))
    if not found and old == new:
        same = before.split(" -> ")[0] == now.split(" -> ")[0] or _reordered_keywords_or_derived_base(name, before, now)
        found.append(("additive" if same else "breaking", f"{name}: {before} -> {now}"))
    return found


def _reordered_keywords_or_derived_base(name: str, before: str, now: str) -> bool:
    """Whether two lines of one class, their parameters the same, differ only where no caller notices: the order of
    keyword-only parameters (a record's fields), and a base the class now derives its old bases through."""
    kinds = [re.match(r"class\(([^)]*)\)(\(\*, )?", line) for line in (before, now)]
    if not all(kinds) or not all(k.group(2) for k in kinds):
        return False
    module, _, attr = name.rpartition(".")
    try:
        cls = getattr(__import__(module, fromlist=[attr]), attr)
    except (ImportError, AttributeError):
        return False
    return {b.strip() for b in kinds[0].group(1).split(",")} <= {c.__name__ for c in inspect.getmro(cls)}


def classify(before: list[str], now: list[str]) -> list[tuple[str, str, str]]:
    """Each change between two snapshots as (``'additive'`` or ``'breaking'``, the name, what changed)."""
    a, b = _entries(before), _entries(now)
    out = []
    for name in sorted(set(a) | set(b)):
        if name not in b:
            out.append(("breaking", name, f"{name} removed"))
        elif name not in a:
            out.append(("additive", name, f"{name} added"))
        else:
            (line_a, members_a), (line_b, members_b) = a[name], b[name]
            if line_a != line_b and name.endswith(".API_VERSION"):
                out.append(("version", name, f"{name}: {line_a} -> {line_b}"))
            elif line_a != line_b:
                out += [(kind, name, what) for kind, what in _compare(name, line_a, line_b)]
            for m in sorted(set(members_a) | set(members_b)):
                if m not in members_b:
                    out.append(("breaking", name, f"{name}.{m} removed"))
                elif m not in members_a:
                    out.append(("additive", name, f"{name}.{m} added"))
                elif members_a[m] != members_b[m]:
                    out += [(kind, name, what) for kind, what in _compare(f"{name}.{m}", members_a[m], members_b[m])]
    return out


def _api_version(lines: list[str]) -> int:
    [line] = [x for x in lines if x.startswith("edgeplug.plugin.API_VERSION: ")]
    return int(line.rsplit("= ", 1)[1])


def breaking_without_a_rename(before: list[str], now: list[str]) -> list[str]:
    """What a breaking change lacks: an API version bump, and a ``RENAMES`` entry naming each old spelling."""
    from edgeplug._api import RENAMES

    breaking = [(name, what) for kind, name, what in classify(before, now) if kind == "breaking"]
    if not breaking:
        return []
    missing = []
    if _api_version(now) <= _api_version(before):
        missing.append(f"edgeplug.plugin.API_VERSION is still {_api_version(before)}: a breaking change bumps it")
    olds = [r.old for r in RENAMES if r.since == _api_version(now)]
    for name, what in breaking:
        short = name.rsplit(".", 1)[1]
        field = re.match(r"[\w.]+\((\w+)=\)", what)
        wanted = f"{short}({field.group(1)}=)" if field else name
        if not any(o == wanted or o.startswith(wanted + ".") for o in olds):
            missing.append(f"{what}: no edgeplug._api.RENAMES entry for `{wanted}` (since API {_api_version(now)})")
    return missing


def test_the_surfaces_match_the_checked_in_snapshot():
    now = _surface()
    if os.environ.get(UPDATE):
        SNAPSHOT.write_text("\n".join(now) + "\n")
    assert SNAPSHOT.is_file(), f"{SNAPSHOT.name} is missing: run {UPDATE}=1 pytest tests/test_public_surface.py"
    before = SNAPSHOT.read_text().splitlines()
    diff = "\n".join(difflib.unified_diff(before, now, "tests/public_surface.txt", "the code now", lineterm=""))
    changes = "\n".join(f"  {kind}: {what}" for kind, _, what in classify(before, now))
    assert now == before, (
        f"the public surface changed (the __all__ of {', '.join(SNAPSHOT_MODULES)}, a signature, a member):\n"
        f"{changes}\n{diff}\n"
        "A breaking change needs an edgeplug._api.RENAMES entry for each old spelling and an API version bump "
        "(test_a_breaking_change_names_its_renames_and_bumps_the_api checks). "
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


def test_a_breaking_change_names_its_renames_and_bumps_the_api():
    """Against the checked-in snapshot: additive changes pass; a breaking one needs RENAMES entries and a bump."""
    before = SNAPSHOT.read_text().splitlines()
    missing = breaking_without_a_rename(before, _surface())
    assert not missing, "breaking changes to the public surface:\n  " + "\n  ".join(missing)


_SPEC = (
    "edgeplug.plugin.BackendSpec: class(_Record)(*, backend: str, partitioner: Callable[[], Any], "
    "verify_method: Literal['pte', 'kernels', 'none'] = 'none', external_weights: bool = False{extra}) -> None"
)


def _snapshot(spec: str, *, api: int = 1, extra_names: tuple[str, ...] = ()) -> list[str]:
    return [
        f"edgeplug.plugin.API_VERSION: int = {api}",
        spec,
        "edgeplug.plugin.KernelError: class(EdgeplugError)(...)",
        *extra_names,
        "edgeplug.testing.rms_norm_cases.CASES: tuple of 28 Case",
    ]


def test_the_classification_calls_a_new_optional_field_and_new_names_additive():
    """The device_runtime field and the runtime errors another change adds are additive: no bump, no rename."""
    before = _snapshot(_SPEC.format(extra=""))
    now = _snapshot(
        _SPEC.format(extra=", device_runtime: Optional[Callable[[], Any]] = None"),
        extra_names=(
            "edgeplug.plugin.RuntimeNotFound: class(EdgeplugError)(...)",
            "edgeplug.plugin.RuntimeRefusedError: class(VerificationError)(...)",
        ),
    )
    now[-1] = "edgeplug.testing.rms_norm_cases.CASES: tuple of 31 Case"
    changes = classify(before, now)
    assert {kind for kind, _, _ in changes} == {"additive"}, changes
    assert {what for _, _, what in changes} >= {
        "edgeplug.plugin.BackendSpec(device_runtime=) added", "edgeplug.plugin.RuntimeNotFound added"
    }
    assert breaking_without_a_rename(before, now) == []


def test_the_classification_calls_a_removed_field_breaking_and_asks_for_its_rename_and_a_bump():
    before = _snapshot(_SPEC.format(extra=", verify: Literal['pte', 'kernels', 'none'] = 'none'").replace(
        "verify_method: Literal['pte', 'kernels', 'none'] = 'none', ", ""))
    now = _snapshot(_SPEC.format(extra=""))
    kinds = {what: kind for kind, _, what in classify(before, now)}
    assert kinds["edgeplug.plugin.BackendSpec(verify=) removed"] == "breaking"
    missing = breaking_without_a_rename(before, now)
    assert any("API_VERSION is still 1" in m for m in missing), missing
    # with the bump to the API whose rename it is (RENAMES: BackendSpec(verify=), since API 1), nothing is missing
    assert breaking_without_a_rename([before[0].replace("= 1", "= 0"), *before[1:]], now) == []


@pytest.mark.parametrize(
    "before, now, kind",
    [
        # the shared Partitioning record: the same keyword-only fields, reordered, and a base deriving from BaseModel
        ("class(BaseModel)(*, a: int = 1, b: str = '')", "class(Partitioning)(*, b: str = '', a: int = 1)", "additive"),
        ("class(Exception)(*, a: int = 1, b: str = '')", "class(Partitioning)(*, b: str = '', a: int = 1)", "breaking"),
        ("class(BaseModel)(a: int = 1, b: str = '')", "class(BaseModel)(b: str = '', a: int = 1)", "breaking"),  # positional
    ],
)
def test_a_record_reordering_its_fields_under_a_derived_base_is_additive(before, now, kind):
    name = "edgeplug.LoweringReport"  # the live class decides what its bases derive from
    changes = classify([f"{name}: {before} -> None"], [f"{name}: {now} -> None"])
    assert [k for k, _, _ in changes] == [kind], changes


@pytest.mark.parametrize(
    "before, now, kind",
    [
        ("Literal['keep', 'fold']", "Literal['keep', 'fold', 'ones']", "additive"),  # a Literal widened
        ("Literal['keep', 'fold', 'ones']", "Literal['keep', 'fold']", "breaking"),  # narrowed
        ("bool = False", "bool = True", "breaking"),  # a default changed
    ],
)
def test_the_classification_of_a_changed_field(before, now, kind):
    line = "edgeplug.plugin.FusionPolicy: class(_Record)(*, backend: str, weightless: {}) -> None"
    changes = classify(_snapshot(line.format(before)), _snapshot(line.format(now)))
    assert [k for k, _, _ in changes] == [kind], changes


def test_the_classification_calls_a_removed_name_or_member_breaking():
    before = _snapshot(_SPEC.format(extra=""), extra_names=("edgeplug.plugin.Verdict: class(object)(ok: bool) -> None", "    .reason: property"))
    gone = _snapshot(_SPEC.format(extra=""), extra_names=("edgeplug.plugin.Verdict: class(object)(ok: bool) -> None",))
    assert [(k, w) for k, _, w in classify(before, gone)] == [("breaking", "edgeplug.plugin.Verdict.reason removed")]
    assert [(k, w) for k, _, w in classify(before, _snapshot(_SPEC.format(extra="")))] == [
        ("breaking", "edgeplug.plugin.Verdict removed")
    ]
