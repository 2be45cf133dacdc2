"""No import circle in a first-party plugin (issue 48), counting imports inside functions: an import
deferred into a function that closes a circle only hides it (two modules that each need the other are one
module, or share a third below both).

Each plugin package (``plugins/*/edgeplug_*``) is read with ``ast``: an arrow A -> B for each import of
a module B of the same package in A, at module level or in a function (``if TYPE_CHECKING:`` skipped).
"""

from __future__ import annotations

import ast
from pathlib import Path

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def _name(package: Path, path: Path) -> str:
    parts = [package.name, *path.relative_to(package).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def arrows(package: Path) -> dict[str, set[str]]:
    """module -> the modules of ``package`` it imports (anywhere but under TYPE_CHECKING)."""
    modules = {_name(package, p): p for p in sorted(package.rglob("*.py"))}
    out: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]

        def visit(node: ast.AST) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    continue
                named: list[str] = []
                if isinstance(child, ast.Import):
                    named = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        up = here
                        for _ in range(child.level - 1):
                            up = up.rpartition(".")[0]
                        base = f"{up}.{base}" if base else up
                    named = [base, *(f"{base}.{a.name}" for a in child.names)]
                for name in named:
                    if name in modules and name != module and not module.startswith(name + "."):
                        out[module].add(name)
                visit(child)

        visit(ast.parse(path.read_text(), str(path)))
    return out


def circles(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for start in sorted(graph):
        for first in sorted(graph[start]):
            seen, todo = {first: [start, first]}, [first]
            while todo:
                here = todo.pop(0)
                for nxt in sorted(graph.get(here, ())):
                    if nxt == start:
                        found.append(" -> ".join([*seen[here], start]))
                        todo = []
                        break
                    if nxt not in seen:
                        seen[nxt] = [*seen[here], nxt]
                        todo.append(nxt)
    return sorted(set(found))


def test_no_plugin_has_an_import_circle():
    packages = sorted(p for p in PLUGINS.glob("*/edgeplug_*") if p.is_dir())
    assert packages, "no plugin package found"
    found = [c for package in packages for c in circles(arrows(package))]
    assert not found, "import circles in plugins (functions' imports included):\n  " + "\n  ".join(found)


def test_the_reader_sees_a_circle_hidden_in_a_function(tmp_path):
    package = tmp_path / "edgeplug_planted"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from edgeplug_planted import b\n")
    (package / "b.py").write_text("def f():\n    from edgeplug_planted.a import x\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from edgeplug_planted import a\n")
    graph = arrows(package)
    assert graph["edgeplug_planted.c"] == set()
    assert circles(graph) == ["edgeplug_planted.a -> edgeplug_planted.b -> edgeplug_planted.a",
                              "edgeplug_planted.b -> edgeplug_planted.a -> edgeplug_planted.b"]
