"""``import edgeplug`` changes nothing of the process (issue 48): no import hook on ``sys.meta_path`` or
``sys.path_hooks``, no warnings filter, no logging handler; the previous plugin API's module paths are
modules of their own, one per path ``edgeplug._api.RENAMES`` moved, each three lines."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from edgeplug import _api

PACKAGE = Path(__file__).resolve().parents[1] / "core" / "edgeplug"

#: prints what of the process's global state an import changed, as lines ``what: before -> after``
_PROBE = """
import logging, sys, warnings
def state():
    return {
        "meta_path": [type(f).__qualname__ for f in sys.meta_path],
        "path_hooks": [repr(h) for h in sys.path_hooks],
        "warnings filters": [repr(f) for f in warnings.filters],
        "root log handlers": [repr(h) for h in logging.getLogger().handlers],
    }
before = state()
IMPORT
after = state()
for key in before:
    if before[key] != after[key]:
        print(f"{key}: {before[key]} -> {after[key]}")
"""


def changed_by(code: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.replace("IMPORT", textwrap.dedent(code))], capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


def test_import_edgeplug_and_its_author_surface_change_nothing_global():
    assert changed_by("import edgeplug, edgeplug.plugin") == []


def test_the_probe_sees_a_planted_hook_and_filter():
    changed = changed_by("import sys, warnings\nsys.meta_path.append(object())\nwarnings.simplefilter('default', UserWarning)")
    assert [c.split(":")[0] for c in changed] == ["meta_path", "warnings filters"], changed


def test_each_old_path_is_a_module_of_its_own_and_nothing_else_is():
    expected = set()
    for module in _api.old_paths():
        parts = module.split(".")[1:]
        package = any(other.startswith(module + ".") for other in _api.old_paths())
        expected.add(Path(*parts, "__init__.py") if package else Path(*parts[:-1], parts[-1] + ".py"))
    found = {
        p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py")
        if "old_path(__name__)" in p.read_text()
    }
    assert found == expected, f"old-path modules {sorted(map(str, found))}, RENAMES asks for {sorted(map(str, expected))}"


def test_an_old_path_warns_naming_the_new_one_and_its_unknown_names_say_where_to_look():
    proc = subprocess.run(
        [sys.executable, "-W", "always", "-c",
         "import edgeplug.partition.verdict as v\nimport edgeplug.plugin\nassert v.refuse is edgeplug.plugin.refuse\n"
         "try:\n    v.nothing\nexcept AttributeError as e:\n    print('unknown:', e)"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "`edgeplug.partition.verdict.refuse` is now `edgeplug.plugin.refuse` (deprecated in plugin API 1" in proc.stderr
    assert "unknown: edgeplug.partition.verdict.nothing is no spelling of any plugin API" in proc.stdout
