"""The `edgeplug` command line on the samsung backend (the command line itself is the core's tests/test_cli.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("_no_sdk_variables")


@pytest.fixture
def _no_sdk_variables(monkeypatch):
    for var in ("QNN_SDK_ROOT", "EXYNOS_AI_LITECORE_ROOT", "EDGEPLUG_PLUGINS", "EDGEPLUG_DISABLE_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    from edgeplug import _plugins

    _plugins.reset()


@pytest.fixture
def cli(capsys, monkeypatch, tmp_path):
    """Run ``edgeplug ARGS...`` in this process, in an empty working directory: (exit code, stdout, stderr)."""
    from edgeplug._cli import main

    monkeypatch.chdir(tmp_path)

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse usage errors
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _delegate_ids(pte: bytes) -> set[str]:
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte).program
    return {d.id for plan in program.execution_plan for d in plan.delegates}


def _row(out: str, backend: str) -> str:
    return next(r for r in out.splitlines() if r.split()[:1] == [backend])

def test_backends_row_says_the_sdk_is_not_configured(cli):
    code, out, err = cli("backends", "--no-adapter")
    assert code == 0, err
    assert "EXYNOS_AI_LITECORE_ROOT is not set" in _row(out, "samsung")


def test_lowering_without_the_sdk_names_its_variable(cli, tmp_path):
    code, stdout, stderr = cli("lower", "mlp", "--backend", "samsung", "-o", tmp_path / "m.pte")
    assert code != 0 and stdout == ""
    assert stderr.startswith("edgeplug: error: backend 'samsung' cannot serialize its delegate here")
    assert "(EXYNOS_AI_LITECORE_ROOT is not set)" in stderr and "set EXYNOS_AI_LITECORE_ROOT to its root" in stderr
    assert "Use --dry-run" in stderr
    assert not list(tmp_path.rglob("*.pte"))
