"""The two public surfaces: ``edgeplug`` (users) and ``edgeplug.plugin`` (backend authors).

Everything else in the core may change without notice, so first-party plugins
import from these two modules only, and a change to either surface is made on
purpose: the snapshot below must be updated with it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLIC_MODULES = ("edgeplug", "edgeplug.plugin")


def _plugin_sources() -> list[Path]:
    return sorted(p for p in (ROOT / "plugins").glob("*/edgeplug_*/**/*.py"))


def _private_imports(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: module`` for each import of an edgeplug module other than the two public ones."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
            if node.module == "edgeplug":  # `from edgeplug import plugins` imports a module too
                modules += [f"edgeplug.{a.name}" for a in node.names if a.name[:1].islower() and a.name != "hookimpl"]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        else:
            continue
        for module in modules:
            if (module == "edgeplug" or module.startswith("edgeplug.")) and module not in PUBLIC_MODULES:
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


def test_the_import_check_sees_private_imports(tmp_path):
    src = tmp_path / "hooks.py"
    src.write_text(
        "import edgeplug\nfrom edgeplug.plugin import BackendSpec\nfrom edgeplug import plugin, hookimpl\n"
        "from edgeplug.graph.canonical import rewrite_pass\nimport edgeplug.partition.verdict\n"
        "from edgeplug import plugins\n"
    )
    hits = [h.split(": ", 1)[1] for h in _private_imports(src, tmp_path)]
    assert hits == ["edgeplug.graph.canonical", "edgeplug.partition.verdict", "edgeplug.plugins"]


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
