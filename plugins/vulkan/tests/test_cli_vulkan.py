"""The `edgeplug` command line on the vulkan backend (the command line itself is the core's tests/test_cli.py)."""

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

def test_backends_row(cli):
    code, out, err = cli("backends", "--no-adapter")
    assert code == 0, err
    assert _row(out, "vulkan").split()[:5] == ["vulkan", "edgeplug-vulkan", "0.1.0", "kernels", "yes"]


@pytest.mark.slow
def test_demo_llama_for_vulkan_gives_a_vulkan_delegate_executorch_reads_back(cli, tmp_path):
    out, rep = tmp_path / "llama-vulkan.pte", tmp_path / "llama-vulkan.json"
    code, stdout, stderr = cli("lower", "llama", "--backend", "vulkan", "-o", out, "--report", rep)
    assert code == 0, stderr
    match = re.search(r"^partitions: (\d+) \(delegated (\d+) nodes\)", stdout, re.M)
    assert match and int(match.group(1)) >= 1 and int(match.group(2)) > 0
    assert re.search(r"^\s+\S+\s+VulkanBackend\s+\d+ nodes", stdout, re.M)
    assert "VulkanBackend" in _delegate_ids(out.read_bytes())
    data = json.loads(rep.read_text())
    assert any(p["backend_id"] == "VulkanBackend" for p in data["partitions"])


