"""The `edgeplug` command line on the qnn backend (the command line itself is the core's tests/test_cli.py)."""

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
    assert "no: the QNN SDK is not configured (QNN_SDK_ROOT is not set)" in _row(out, "qnn")


def test_backends_says_what_is_skipped(cli, monkeypatch):
    monkeypatch.setenv("EDGEPLUG_DISABLE_PLUGINS", "qnn")
    code, out, err = cli("backends", "--no-adapter")
    assert code == 0 and not re.search(r"^qnn\b", out, re.M)
    assert "skipped plugin 'qnn' (edgeplug-qnn): blocked by EDGEPLUG_DISABLE_PLUGINS=qnn" in err


def test_dry_run_for_qnn_writes_the_report_and_no_pte(cli, tmp_path):
    rep = tmp_path / "qnn.json"
    code, stdout, stderr = cli("lower", "mlp", "-b", "qnn", "--dry-run", "-o", tmp_path / "mlp.pte", "--report", rep)
    assert code == 0, stderr
    assert "(dry run: nothing serialized)" in stdout
    assert "would delegate" in stdout
    assert f"--dry-run: {tmp_path / 'mlp.pte'} was not written" in stdout
    assert not list(tmp_path.rglob("*.pte"))
    data = json.loads(rep.read_text())
    assert data["dry_run"] is True and data["output_path"] is None
    assert data["partitions"] and all(p["backend_id"] == "QnnBackend" for p in data["partitions"])


@pytest.mark.parametrize(
    "backend, variable", [("qnn", "QNN_SDK_ROOT")]
)
def test_sdk_backend_without_dry_run_names_the_sdk_variable(cli, tmp_path, backend, variable):
    code, stdout, stderr = cli("lower", "mlp", "--backend", backend, "-o", tmp_path / "m.pte")
    assert code != 0
    assert stdout == ""
    assert stderr.startswith(f"edgeplug: error: backend '{backend}' cannot serialize its delegate here")
    assert f"({variable} is not set)" in stderr and f"set {variable} to its root" in stderr
    assert "Use --dry-run" in stderr
    assert not list(tmp_path.rglob("*.pte"))


def test_qnn_sdk_root_pointing_nowhere_is_named(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path))
    code, _, stderr = cli("lower", "mlp", "--backend", "qnn")
    assert code == 2
    assert f"QNN_SDK_ROOT={tmp_path} has no lib/x86_64-linux-clang/libQnnHtp.so" in stderr


