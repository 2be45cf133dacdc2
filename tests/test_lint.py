"""``make lint`` (the first step of ``make test``): ruff and mypy with the project's configuration
(pyproject.toml). Each would fail on a planted violation: an unused import, a statement after a return;
ruff passes on the core and the plugins as they are (mypy's run over the tree is ``make lint``'s, a
minute that the suite does not repeat)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "pyproject.toml"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    found = BIN / name if (BIN / name).exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed here (pip install -e '.[test]' brings it)")
    return str(found)


def test_ruff_passes_on_the_core_and_the_plugins():
    out = subprocess.run([_tool("ruff"), "check", "--no-cache", "core", "plugins"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


def test_ruff_fails_on_a_planted_unused_import(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import os\n\n\ndef f(items):\n    return [lambda: i for i in items]\n")
    out = subprocess.run(
        [_tool("ruff"), "check", "--no-cache", "--config", str(CONFIG), str(planted)], capture_output=True, text=True,
    )
    assert out.returncode == 1, out.stdout
    assert "F401" in out.stdout and "B023" in out.stdout, out.stdout


def test_mypy_fails_on_a_planted_dead_statement_and_a_wrong_type(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "def last(x: int) -> int:\n    return x\n    return 0\n\n\n"
        "def named(backend: object) -> str:\n    return backend.name\n"
    )
    out = subprocess.run(
        [_tool("mypy"), "--config-file", str(CONFIG), "--cache-dir", str(tmp_path / "cache"), str(planted)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "planted.py:3: error: Statement is unreachable" in out.stdout, out.stdout
    assert 'planted.py:7: error: "object" has no attribute "name"' in out.stdout, out.stdout
