"""Imports inside functions in the core: each one says why it is there, and there are few of them.

An import belongs at the top of its module, where a reader sees what the
module depends on. One inside a function is there because the top would cost
something: an import cycle, an import-time cost (``import edgeplug``, the
CLI's startup and the pytest plugin load no torch or executorch), or an
optional dependency. Such an import carries its reason as a comment on its
line or on the line above; a run of imports one after another shares the
comment above its first line (blank lines between them do not end a run). An import under ``if TYPE_CHECKING:`` is not
counted (it never runs).

``python tests/test_function_imports.py`` prints the figures for the whole
core and for the modules held to the rule.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "core"
PACKAGE = CORE / "edgeplug"
#: function-level imports per 1,000 lines, at most
MAX_RATE = 5.0
#: modules (paths under core/edgeplug; a folder ends in "/") not yet held to the rule (issue 38).
#: Remove an entry once its imports are moved up or explained; the test fails while a listed one already complies.
PENDING: tuple[str, ...] = ()  # empty since _verify/ and _zoo/ were brought to the rule: the whole core is held


@dataclass(frozen=True)
class FunctionImport:
    path: str  # relative to core/edgeplug
    line: int
    source: str
    reason: str  # the comment that explains it, "" when there is none


def _is_pending(path: str) -> bool:
    return any(path == p or (p.endswith("/") and path.startswith(p)) for p in PENDING)


#: a linter's or type checker's marker is not a reason
_MARKERS = re.compile(r"noqa(:\s*[A-Z]+[0-9]+(,\s*[A-Z]+[0-9]+)*)?|type:\s*ignore(\[[^\]]*\])?|pragma:\s*no cover")


def _comment(line: str) -> str:
    """The comment on a source line without linter markers, "" when none is left."""
    _, hash_, comment = line.partition("#")
    return _MARKERS.sub("", comment).strip(" #") if hash_ else ""


def function_imports(source: str, path: str = "<src>") -> list[FunctionImport]:
    """Every import inside a function of ``source``, with the reason comment it carries."""
    lines = source.splitlines()
    out: list[FunctionImport] = []

    def above(node: ast.stmt, previous: ast.stmt | None) -> str:
        """The comment on the line above ``node``, or above the first import of the run it ends."""
        between = lines[previous.end_lineno : node.lineno - 1] if previous is not None else []
        if isinstance(previous, (ast.Import, ast.ImportFrom)) and not any(line.strip() for line in between):
            return above(previous, runs.get(previous))
        line = lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
        if line.startswith("#"):
            return line[1:].strip()
        opens_block = line.partition("#")[0].rstrip().endswith(":")  # `try:  # why`
        return _comment(line) if opens_block else ""

    runs: dict[ast.stmt, ast.stmt | None] = {}

    def reason_for(node: ast.stmt, previous: ast.stmt | None) -> str:
        runs[node] = previous
        return _comment(lines[node.lineno - 1]) or _comment(lines[node.end_lineno - 1]) or above(node, previous)

    def visit(node: ast.AST, in_function: bool) -> None:
        body_prev: ast.stmt | None = None
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                body_prev = child
                continue
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                reason = reason_for(child, body_prev)
                out.append(FunctionImport(path, child.lineno, ast.unparse(child), reason))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
            if isinstance(child, ast.stmt):
                body_prev = child

    visit(ast.parse(source, path), False)
    return out


def survey() -> dict[str, tuple[int, list[FunctionImport]]]:
    """path -> (its lines, its function-level imports), for every module of the core."""
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        rel = p.relative_to(PACKAGE).as_posix()
        text = p.read_text()
        out[rel] = (len(text.splitlines()), function_imports(text, rel))
    return out


def _rate(entries) -> tuple[int, int, float]:
    lines = sum(n for n, _ in entries)
    count = sum(len(found) for _, found in entries)
    return count, lines, 1000 * count / max(lines, 1)


def test_every_function_level_import_says_why():
    unexplained = [
        f"core/edgeplug/{imp.path}:{imp.line}: {imp.source}"
        for path, (_, found) in survey().items()
        if not _is_pending(path)
        for imp in found
        if not imp.reason
    ]
    assert not unexplained, (
        "imports inside functions without a reason (move each to the top of its module, or say on its line "
        "or the line above why it must wait: a cycle, an import-time cost, an optional dependency):\n  "
        + "\n  ".join(unexplained)
    )


def test_function_level_imports_are_few():
    held = [entry for path, entry in survey().items() if not _is_pending(path)]
    count, lines, rate = _rate(held)
    assert rate <= MAX_RATE, (
        f"{count} function-level imports in {lines} lines of core/edgeplug held to the rule: {rate:.1f} per "
        f"1,000 lines, above {MAX_RATE} (move imports to the top of their module)"
    )


def test_the_pending_list_only_names_modules_that_still_need_it():
    modules = survey()
    stale = []
    for entry in PENDING:
        mine = [(path, found) for path, (_, found) in modules.items() if path == entry or (entry.endswith("/") and path.startswith(entry))]
        if not mine:
            stale.append(f"{entry}: no such module")
        elif all(imp.reason for _, found in mine for imp in found):
            stale.append(f"{entry}: every function-level import in it says why; take it off PENDING")
    assert not stale, "PENDING in tests/test_function_imports.py is out of date:\n  " + "\n  ".join(stale)


def test_the_reader_finds_unexplained_imports_and_their_reasons():
    source = (
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "def f():\n"
        "    if TYPE_CHECKING:\n"
        "        from torch import Tensor\n"
        "    import json\n"
        "    # torch: heavy, only when lowering\n"
        "    import torch\n"
        "\n"
        "    from torch.export import ExportedProgram\n"
        "    x = 1  # a statement's comment is no reason for the import below\n"
        "    import re  # re: cheap, but a cycle\n"
        "    import sys  # noqa: F401\n"
        "class C:\n"
        "    def g(self):\n"
        "        return lambda: __import__('x')\n"
        "    def h(self):\n"
        "        from edgeplug import (\n"
        "            lower,\n"
        "        )  # a cycle: edgeplug._pipeline imports this module\n"
        "        try:  # optional: Model Explorer\n"
        "            import model_explorer\n"
        "        except ImportError:\n"
        "            import math\n"
    )
    found = {imp.source: (imp.line, imp.reason) for imp in function_imports(source)}
    assert found == {
        "import json": (6, ""),
        "import torch": (8, "torch: heavy, only when lowering"),
        "from torch.export import ExportedProgram": (10, "torch: heavy, only when lowering"),
        "import re": (12, "re: cheap, but a cycle"),
        "import sys": (13, ""),
        "from edgeplug import lower": (18, "a cycle: edgeplug._pipeline imports this module"),
        "import model_explorer": (22, "optional: Model Explorer"),
        "import math": (24, ""),
    }
    count, lines, rate = _rate([(len(source.splitlines()), list(found))])
    assert (count, lines) == (8, 24) and round(rate) == 333


if __name__ == "__main__":
    modules = survey()
    for label, entries in (
        ("core/edgeplug", list(modules.values())),
        ("held to the rule", [e for p, e in modules.items() if not _is_pending(p)]),
        ("pending", [e for p, e in modules.items() if _is_pending(p)]),
    ):
        count, lines, rate = _rate(entries)
        print(f"{label}: {count} function-level imports in {lines} lines, {rate:.1f} per 1,000")
    if "-v" in sys.argv:
        for path, (_, found) in modules.items():
            for imp in found:
                print(f"  {path}:{imp.line}: {imp.source}  # {imp.reason or '(no reason)'}")
