"""Fault injection on qnn: an SoC executorch does not know is one line naming the partitioner factory and plugin.

Moved from the core's tests/test_faults.py (issue 23).
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def cli(capsys):
    """Run ``edgeplug ARGS...`` in this process: returns (exit code, stdout, stderr)."""
    from edgeplug._cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse usage errors
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture(autouse=True)
def _clean(monkeypatch, tmp_path):
    for var in ("EDGEPLUG_PLUGINS", "EDGEPLUG_DISABLE_PLUGINS", "EDGEPLUG_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _no_traceback(stderr: str) -> None:
    assert "Traceback (most recent call last)" not in stderr, stderr


def _first_line(stderr: str) -> str:
    lines = [l for l in stderr.splitlines() if l.startswith("edgeplug: error:")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_qnn_with_an_unknown_soc_is_one_line_naming_the_factory_and_plugin(cli, tmp_path, monkeypatch):
    # the real QNN plugin, no SDK (a dry run), and a SoC executorch does not know
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    monkeypatch.setenv("EDGEPLUG_QNN_SOC", "SM9999")
    code, stdout, stderr = cli("lower", "mlp", "-b", "qnn", "--dry-run", "-q")
    assert code == 2 and stdout == ""
    first = _first_line(stderr)
    assert first.startswith("edgeplug: error: stage 'to_edge': the partitioner factory (BackendSpec.partitioner) of backend 'qnn'")
    assert "plugin 'qnn'" in first and "edgeplug-qnn" in first
    assert "raised ValueError: EDGEPLUG_QNN_SOC=SM9999 names no Qualcomm SoC ExecuTorch knows" in first
    _no_traceback(stderr)
