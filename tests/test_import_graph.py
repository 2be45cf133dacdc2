"""The core's import graph: every module imports alone, no cycle, and none hidden in a function.

The graph is read with ``ast`` from ``core/edgeplug``: an edge A -> B for each
``import``/``from ... import`` of an edgeplug module B in A (a name imported
from a package that is one of its submodules counts as that submodule; an
import inside ``if TYPE_CHECKING:`` does not count). An edge to one of A's own
parent packages is left out: Python has started importing those before A runs.

- module level: no cycle;
- function level: an import inside a function is there to defer a heavy
  dependency (torch, executorch, ...) until it is needed, never to break a
  cycle, so none may point back along the module-level graph (made a
  module-level import, it would close a cycle);
- each module imports alone, in a fresh interpreter.

(The two cycles the redesign started from, ``_graph.canonical`` <->
``canonical_static`` and ``_registry -> _fusion -> _partition -> _backend ->
_registry``, are gone: the graph and state engineers removed them, so nothing is
exempt here.)

``python tests/test_import_graph.py`` prints the figures: modules, edges, and the
function-level edgeplug imports, with those that defer nothing heavy (their
module imports every heavy dependency their target does already).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

CORE = Path(__file__).resolve().parents[1] / "core"
PACKAGE = CORE / "edgeplug"
#: dependencies slow to import: a function-level import of an edgeplug module that brings one is laziness
HEAVY = frozenset({"torch", "executorch", "torchao", "wgpu", "transformers", "coremltools", "numpy", "pydantic", "pluggy"})


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(CORE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


@dataclass
class Import:
    module: str
    line: int
    targets: list[str]
    in_function: bool


@dataclass
class ImportGraph:
    files: dict[str, Path]
    #: module -> the edgeplug modules it imports at module level (parents of the module left out)
    edges: dict[str, set[str]] = field(default_factory=dict)
    #: edgeplug imports inside functions
    deferred: list[Import] = field(default_factory=list)
    #: module -> the heavy third-party packages it imports at module level
    heavy: dict[str, set[str]] = field(default_factory=dict)

    def reachable(self, start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for nxt in self.edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    def path(self, start: str, goal: str) -> Optional[list[str]]:
        """A module-level import path from ``start`` to ``goal``, or None."""
        previous: dict[str, str] = {}
        todo = [start]
        while todo:
            here = todo.pop(0)
            for nxt in sorted(self.edges.get(here, ())):
                if nxt not in previous and nxt != start:
                    previous[nxt] = here
                    if nxt == goal:
                        chain = [goal]
                        while chain[-1] != start:
                            chain.append(previous[chain[-1]])
                        return chain[::-1]
                    todo.append(nxt)
        return None

    def heavy_closure(self, module: str) -> set[str]:
        """The heavy packages importing ``module`` loads (its own, its parents', and every module it imports's)."""
        out: set[str] = set()
        for m in {module, *_parents(module), *self.reachable(module)}:
            out |= self.heavy.get(m, set())
        return out


def _targets(node: ast.Import | ast.ImportFrom, module: str, files: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        named = [a.name for a in node.names]
    else:
        if node.level:
            base = module if files[module].name == "__init__.py" else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            source = f"{base}.{node.module}" if node.module else base
        else:
            source = node.module or ""
        named = [source, *(f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in files)]
    out: list[str] = []
    for name in named:
        if name.split(".")[0] != "edgeplug":
            continue
        for m in [*_parents(name), name]:
            if m in files and m not in out:
                out.append(m)
    return out


def _heavy(node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name.split(".")[0] for a in node.names} & HEAVY
    return {node.module.split(".")[0]} & HEAVY if node.module and not node.level else set()


def import_graph() -> ImportGraph:
    files = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    graph = ImportGraph(files)
    for module, path in files.items():
        graph.edges[module], graph.heavy[module] = set(), set()

        def visit(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    own = _parents(module)
                    targets = [t for t in _targets(child, module, files) if t != module and t not in own]
                    if in_function:
                        if targets:
                            graph.deferred.append(Import(module, child.lineno, targets, True))
                    else:
                        graph.edges[module].update(targets)
                        graph.heavy[module] |= _heavy(child)
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        visit(ast.parse(path.read_text(), str(path)), False)
    return graph


def _where(graph: ImportGraph, module: str, line: Optional[int] = None) -> str:
    path = graph.files[module].relative_to(CORE.parent)
    return f"{path}:{line}" if line else str(path)


def test_no_cycle_among_module_level_imports():
    graph = import_graph()
    cycles = []
    for module in sorted(graph.edges):
        for nxt in sorted(graph.edges[module]):
            back = graph.path(nxt, module)
            if back is not None:
                cycles.append(" -> ".join([module, *back]))
    assert not cycles, (
        "module-level import cycles in core/edgeplug (move what both sides need into a lower module, "
        "or hand it in):\n  " + "\n  ".join(cycles)
    )


def test_no_function_level_import_hides_a_cycle():
    graph = import_graph()
    hidden = []
    for imp in graph.deferred:
        for target in imp.targets:
            back = graph.path(target, imp.module)
            if back is not None:
                hidden.append(
                    f"{_where(graph, imp.module, imp.line)} imports {target} inside a function, and "
                    f"{' -> '.join(back)} at module level: a cycle kept out of sight"
                )
    assert not hidden, (
        "function-level imports that break a cycle (a function-level import only defers a heavy "
        "dependency; move what both sides need into a lower module):\n  " + "\n  ".join(hidden)
    )


def test_the_graph_reader_sees_cycles_and_hidden_ones(tmp_path, monkeypatch):
    """The checks above would fail on a cycle: the reader finds one at module level and one in a function."""
    package = tmp_path / "edgeplug"
    (package / "_sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from edgeplug._a import A\n")
    (package / "_a.py").write_text("from edgeplug._b import B\nA = 1\n")
    (package / "_b.py").write_text("import torch\nfrom edgeplug import _a\nB = 2\n")
    (package / "_sub" / "__init__.py").write_text("from edgeplug._sub.x import X\n")
    (package / "_sub" / "x.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from edgeplug._a import A\n"
        "from edgeplug._sub import y\nX = 3\ndef f():\n    from edgeplug._sub.x import X\n    from edgeplug._c import C\n"
    )
    (package / "_sub" / "y.py").write_text("Y = 4\n")
    (package / "_c.py").write_text("from edgeplug._sub.x import X\nC = 5\n")
    monkeypatch.setattr(sys.modules[__name__], "CORE", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    graph = import_graph()
    assert graph.edges["edgeplug._a"] == {"edgeplug._b"} and graph.edges["edgeplug._b"] == {"edgeplug._a"}
    assert graph.edges["edgeplug._sub.x"] == {"edgeplug._sub.y"}  # its parent left out, TYPE_CHECKING skipped
    assert [(d.module, d.targets) for d in graph.deferred] == [("edgeplug._sub.x", ["edgeplug._c"])]
    assert graph.path("edgeplug._c", "edgeplug._sub.x") == ["edgeplug._c", "edgeplug._sub.x"]
    assert graph.heavy_closure("edgeplug._a") == {"torch"} and graph.heavy_closure("edgeplug._sub.y") == set()


#: imports each module named on stdin in turn, with every edgeplug module forgotten in between
_IMPORT_EACH = r"""
import importlib, json, sys, traceback
import torch  # loaded once: the check is about edgeplug's own imports, not torch's import time
failures = {}
for name in json.load(sys.stdin):
    for loaded in [m for m in sys.modules if m == "edgeplug" or m.startswith("edgeplug.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failures[name] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
print(json.dumps(failures))
"""


def test_every_core_module_imports_alone():
    modules = sorted(m for m in import_graph().files if not m.endswith(".__main__"))  # a __main__ runs the CLI
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH], input=json.dumps(modules), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    failures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not failures, "modules that do not import on their own (a cycle, or a name used before it is defined):\n" + "\n".join(
        f"  {name}: {why}" for name, why in failures.items()
    )


def figures() -> dict[str, int]:
    graph = import_graph()
    lazy = [
        imp for imp in graph.deferred
        if any(graph.heavy_closure(t) - graph.heavy_closure(imp.module) for t in imp.targets)
    ]
    return {
        "modules": len(graph.files),
        "module-level edges": sum(len(e) for e in graph.edges.values()),
        "function-level edgeplug imports": len(graph.deferred),
        "  that defer a heavy dependency": len(lazy),
        "  that defer nothing heavy": len(graph.deferred) - len(lazy),
    }


if __name__ == "__main__":
    for name, value in figures().items():
        print(f"{name}: {value}")
