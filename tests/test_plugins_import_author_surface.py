"""First-party plugins import edgeplug only through ``edgeplug.plugin``, the author module, as a third party does.

Every ``.py`` of each plugin's package (``plugins/*/edgeplug_*/``) is read with
``ast``; an import of any other edgeplug module fails the test, named
``file:line``: ``import edgeplug``, ``from edgeplug import x``, ``from
edgeplug._registry import x``, ``importlib.import_module("edgeplug._x")``,
``__import__("edgeplug")``. A plugin's test helpers (a ``testing`` module or
package, imported only by tests) may also use what tests use: ``edgeplug`` (the
user's façade) and ``edgeplug.testing``. Imports between plugin packages
(a backend's package importing its family's shared package) are not edgeplug's and
are fine. The plugins' own ``tests/`` folders are not held to this.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AUTHOR = "edgeplug.plugin"
#: what a plugin's test helpers may import besides the author module
TESTING_ALLOWED = ("edgeplug", "edgeplug.testing")
#: the first-party plugins: the Makefile's PLUGINS, which `make setup` installs (named there, not here: no
#: file under tests/ names a first-party backend)
FIRST_PARTY = set(
    next(line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("PLUGINS :=")).split(":=")[1].split()
)


def _is_edgeplug(module: str) -> bool:
    return module == "edgeplug" or module.startswith("edgeplug.")


def _allowed(module: str, testing: bool) -> bool:
    if module == AUTHOR:
        return True
    return testing and any(module == a or (a != "edgeplug" and module.startswith(a + ".")) for a in TESTING_ALLOWED)


def _imported(node: ast.AST) -> list[tuple[str, str]]:
    """(module, as the failure names it) for each edgeplug module one node imports (none for anything else)."""
    if isinstance(node, ast.Import):
        return [(a.name, a.name) for a in node.names if _is_edgeplug(a.name)]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _is_edgeplug(node.module):
        if node.module != "edgeplug":
            return [(node.module, node.module)]
        out = []  # `from edgeplug import plugin` is the author module, `_registry` a private one, `lower` the façade
        for a in node.names:
            submodule = a.name == "plugin" or a.name == "testing" or a.name.startswith("_")
            out.append((f"edgeplug.{a.name}", f"edgeplug.{a.name}") if submodule else ("edgeplug", f"edgeplug ({a.name})"))
        return out
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        target = node.args[0].value
        if name in ("import_module", "__import__") and isinstance(target, str) and _is_edgeplug(target):
            return [(target, target)]
    return []


def violations(source: str, where: str, *, testing: bool = False) -> list[str]:
    """``where:line: imports what`` for each import of edgeplug other than ``edgeplug.plugin`` in ``source``
    (``testing``: a test helper's, which may also import what tests do)."""
    found = []
    for node in ast.walk(ast.parse(source, filename=where)):
        found += [(node.lineno, shown) for module, shown in _imported(node) if not _allowed(module, testing)]
    return [f"{where}:{line}: imports {shown}" for line, shown in sorted(found)]


def _is_test_helper(path: Path, package: Path) -> bool:
    parts = path.relative_to(package).with_suffix("").parts
    return parts[0] == "testing"


def plugin_violations(root: Path) -> tuple[list[Path], list[str]]:
    """(the package sources read, their violations) for every ``plugins/*/edgeplug_*`` under ``root``."""
    sources, bad = [], []
    for package in sorted(root.glob("plugins/*/edgeplug_*")):
        for path in sorted(package.rglob("*.py")):
            sources.append(path)
            where = path.relative_to(root).as_posix()
            bad += violations(path.read_text(), where, testing=_is_test_helper(path, package))
    return sources, bad


def test_first_party_plugins_import_only_the_author_module():
    sources, bad = plugin_violations(ROOT)
    plugins = {p.relative_to(ROOT / "plugins").parts[0] for p in sources}
    assert plugins == FIRST_PARTY, f"the check read the packages of {sorted(plugins)}, not of {sorted(FIRST_PARTY)}"
    assert not bad, (
        "first-party plugins import edgeplug other than through edgeplug.plugin, the author module a third party "
        "uses; import the name from edgeplug.plugin (if it belongs to the author's surface and is not there, add "
        "it: its __all__ and docstring, tests/public_surface.txt):\n  " + "\n  ".join(bad)
    )


def test_a_planted_import_of_the_core_is_named_with_its_file_and_line(tmp_path):
    """The check fails on each way a plugin can reach the core other than edgeplug.plugin, and only on those."""
    package = tmp_path / "plugins" / "toy" / "edgeplug_toy"
    (package / "testing").mkdir(parents=True)
    (package / "hooks.py").write_text(
        "import importlib\n"
        "import edgeplug\n"  # 2
        "import edgeplug.plugin\n"
        "from edgeplug.plugin import BackendSpec, hookimpl\n"
        "from edgeplug import plugin\n"
        "from edgeplug import hookimpl as hi, plugin as p\n"  # 6: hookimpl through the façade
        "from edgeplug._registry import PluginManager\n"  # 7
        "import edgeplug._graph.ops as ops\n"  # 8
        "from edgeplug_other import records\n"
        "from . import support\n"
        "\n"
        "def late():\n"
        "    from edgeplug.testing import programs\n"  # 13: not in a test helper
        "    importlib.import_module('edgeplug._partition.verdict')\n"  # 14
        "    importlib.import_module('edgeplug.plugin')\n"
        "    return __import__('edgeplug')\n"  # 16
    )
    (package / "testing" / "__init__.py").write_text(
        "import edgeplug\nfrom edgeplug.testing.programs import cached_attention\nfrom edgeplug._registry.lookup import manager\n"
    )
    sources, bad = plugin_violations(tmp_path)
    assert len(sources) == 2
    assert bad == [
        "plugins/toy/edgeplug_toy/hooks.py:2: imports edgeplug",
        "plugins/toy/edgeplug_toy/hooks.py:6: imports edgeplug (hookimpl)",
        "plugins/toy/edgeplug_toy/hooks.py:7: imports edgeplug._registry",
        "plugins/toy/edgeplug_toy/hooks.py:8: imports edgeplug._graph.ops",
        "plugins/toy/edgeplug_toy/hooks.py:13: imports edgeplug.testing",
        "plugins/toy/edgeplug_toy/hooks.py:14: imports edgeplug._partition.verdict",
        "plugins/toy/edgeplug_toy/hooks.py:16: imports edgeplug",
        # a test helper may use the façade and edgeplug.testing, never a private module
        "plugins/toy/edgeplug_toy/testing/__init__.py:3: imports edgeplug._registry.lookup",
    ]


def test_a_plugin_that_imports_only_the_author_module_passes(tmp_path):
    package = tmp_path / "plugins" / "toy" / "edgeplug_toy"
    package.mkdir(parents=True)
    (package / "hooks.py").write_text(
        "from edgeplug.plugin import BackendSpec, hookimpl\n\n@hookimpl\ndef edgeplug_backends():\n"
        "    from edgeplug.plugin import rewrite_pass\n    yield rewrite_pass('drop_identity_copies', backend='toy')\n"
    )
    assert plugin_violations(tmp_path) == ([package / "hooks.py"], [])
