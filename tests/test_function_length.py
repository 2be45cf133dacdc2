"""No function over 60 lines anywhere in the core (issue 38: first the CLI, the pipeline, the report and the
zoo, then every module): a long function hides its steps, so each is split into named steps that read top-down.

A function's length is its lines from ``def`` to its last line, less its docstring (documentation, not
steps: ``edgeplug.lower``'s is the user's manual of its arguments). A nested function counts in its
parent's lines and on its own.

``python tests/test_function_length.py`` lists every function over the limit in the core, held or not.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "core" / "edgeplug"
LIMIT = 60
#: the modules held to the limit (globs under core/edgeplug): all of them
HELD = ("**/*.py",)


def long_functions(source: str, path: str = "<src>", limit: int = LIMIT) -> list[str]:
    """``path:function:length`` for each function of ``source`` longer than ``limit`` lines (its docstring left out)."""
    out = []
    for node in ast.walk(ast.parse(source, path)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = node.end_lineno - node.lineno + 1
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            length -= first.end_lineno - first.lineno + 1
        if length > limit:
            out.append(f"{path}:{node.name}:{length}")
    return out


def _held() -> list[Path]:
    return sorted({p for pattern in HELD for p in PACKAGE.glob(pattern)})


def test_the_held_modules_exist():
    """A pattern that matches nothing would hold nothing to the limit."""
    empty = [pattern for pattern in HELD if not list(PACKAGE.glob(pattern))]
    assert not empty, f"HELD names no module for: {empty}"


def test_no_core_function_is_over_60_lines():
    found = [hit for p in _held() for hit in long_functions(p.read_text(), f"core/edgeplug/{p.relative_to(PACKAGE).as_posix()}")]
    assert not found, (
        f"functions over {LIMIT} lines (docstring left out; split each into named steps that read top-down):\n  "
        + "\n  ".join(found)
    )


def _function(name: str, body_lines: int, docstring_lines: int = 0) -> str:
    doc = ['    """'] + ["    doc"] * (docstring_lines - 2) + ['    """'] if docstring_lines else []
    return "\n".join([f"def {name}():", *doc, *["    x = 1"] * (body_lines - 1)]) + "\n"


def test_the_measure_counts_code_not_docstrings_and_names_file_function_length():
    assert long_functions(_function("at_the_limit", 60), "m.py") == []
    assert long_functions(_function("one_over", 61), "m.py") == ["m.py:one_over:61"]
    assert long_functions(_function("documented", 50, docstring_lines=40), "m.py") == []  # 90 lines, 50 of code
    nested = "def outer():\n" + "".join("    " + line + "\n" for line in _function("inner", 61).splitlines())
    assert long_functions(nested, "m.py") == ["m.py:outer:62", "m.py:inner:61"]


if __name__ == "__main__":
    every = sorted(PACKAGE.rglob("*.py"))
    for p in every:
        for hit in long_functions(p.read_text(), f"core/edgeplug/{p.relative_to(PACKAGE).as_posix()}"):
            print(hit, "" if p in _held() else "(not held)")
    sys.exit(0)
