"""The `edgeplug` command line on the qnn backend (the command line itself is the core's tests/test_cli.py)."""

from __future__ import annotations

import json
import re

import pytest

from edgeplug.testing import backends_row

pytestmark = pytest.mark.usefixtures("edgeplug_plain_env", "_no_sdk_in_tmp_path")


@pytest.fixture
def _no_sdk_in_tmp_path(monkeypatch, tmp_path):
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)


def test_backends_row_says_the_sdk_is_not_configured(edgeplug_cli):
    code, out, err = edgeplug_cli("backends", "--no-adapter")
    assert code == 0, err
    assert "no: the QNN SDK is not configured (QNN_SDK_ROOT is not set)" in backends_row(out, "qnn")


def test_backends_says_what_is_skipped(edgeplug_cli, monkeypatch):
    monkeypatch.setenv("EDGEPLUG_DISABLE_PLUGINS", "qnn")
    code, out, err = edgeplug_cli("backends", "--no-adapter")
    assert code == 0 and not re.search(r"^qnn\b", out, re.M)
    assert "skipped plugin 'qnn' (edgeplug-qnn): blocked by EDGEPLUG_DISABLE_PLUGINS=qnn" in err


def test_dry_run_for_qnn_writes_the_report_and_no_pte(edgeplug_cli, tmp_path):
    rep = tmp_path / "qnn.json"
    code, stdout, stderr = edgeplug_cli("lower", "mlp", "-b", "qnn", "--dry-run", "-o", tmp_path / "mlp.pte", "--report", rep)
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
def test_sdk_backend_without_dry_run_names_the_sdk_variable(edgeplug_cli, tmp_path, backend, variable):
    code, stdout, stderr = edgeplug_cli("lower", "mlp", "--backend", backend, "-o", tmp_path / "m.pte")
    assert code != 0
    assert stdout == ""
    assert stderr.startswith(f"edgeplug: error: backend '{backend}' cannot serialize its delegate here")
    assert f"({variable} is not set)" in stderr and f"set {variable} to its root" in stderr
    assert "Use --dry-run" in stderr
    assert not list(tmp_path.rglob("*.pte"))


def test_qnn_sdk_root_pointing_nowhere_is_named(edgeplug_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path))
    code, _, stderr = edgeplug_cli("lower", "mlp", "--backend", "qnn")
    assert code == 2
    assert f"QNN_SDK_ROOT={tmp_path} has no lib/x86_64-linux-clang/libQnnHtp.so" in stderr


