"""One name, one meaning (issue 38): no two core modules define a module-level function or class of the
same name, unless it is one protocol every such module implements (``ALLOWED`` says which and why). Two
definitions that do the same thing are one function, imported where it is needed; two that do different
things are named for what each does.

``python tests/test_one_name_one_meaning.py`` lists every name defined in more than one core module.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "core" / "edgeplug"
#: name -> why every module defining it means the same thing by it
ALLOWED: dict[str, str] = {}


def definitions(package: Path) -> dict[str, list[str]]:
    """name -> ``module.py:line`` of each module-level ``def``/``class`` of that name under ``package``."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(package.rglob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[node.name].append(f"{path.relative_to(package).as_posix()}:{node.lineno}")
    return found


def shared_names(package: Path, allowed: dict[str, str]) -> list[str]:
    """``name: where, where`` for each name more than one module defines, less the allowed ones."""
    return [
        f"{name}: {', '.join(where)}"
        for name, where in sorted(definitions(package).items())
        if len({w.rsplit(':', 1)[0] for w in where}) > 1 and name not in allowed
    ]


def test_no_two_core_modules_define_one_name():
    shared = shared_names(PACKAGE, ALLOWED)
    assert not shared, (
        "names defined in more than one core module (one function, imported where needed, if they do the same "
        "thing; else a name each that says what it does):\n  " + "\n  ".join(shared)
    )


def test_the_checker_finds_a_planted_duplicate(tmp_path):
    (tmp_path / "a.py").write_text("def _read(path):\n    return open(path).read()\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("class X:\n    def _read(self):\n        pass\n\n\ndef _read(held):\n    return held.getvalue()\n")
    assert shared_names(tmp_path, {}) == ["_read: a.py:1, sub/b.py:6"]  # a method of the same name is not a clash
    assert shared_names(tmp_path, {"_read": "planted"}) == []


if __name__ == "__main__":
    for line in shared_names(PACKAGE, {}):
        print(line, f"(allowed: {ALLOWED[line.split(':')[0]]})" if line.split(":")[0] in ALLOWED else "")
