"""The `edgeplug` command line on the vulkan backend (the command line itself is the core's tests/test_cli.py)."""

from __future__ import annotations

import json
import re

import pytest

from edgeplug.testing import backends_row, delegate_ids

pytestmark = pytest.mark.usefixtures("edgeplug_plain_env", "_in_tmp_path")


@pytest.fixture
def _in_tmp_path(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)


def test_backends_row(edgeplug_cli):
    code, out, err = edgeplug_cli("backends", "--no-adapter")
    assert code == 0, err
    assert backends_row(out, "vulkan").split()[:5] == ["vulkan", "edgeplug-vulkan", "0.1.0", "kernels", "yes"]


@pytest.mark.slow
def test_demo_llama_for_vulkan_gives_a_vulkan_delegate_executorch_reads_back(edgeplug_cli, tmp_path):
    out, rep = tmp_path / "llama-vulkan.pte", tmp_path / "llama-vulkan.json"
    code, stdout, stderr = edgeplug_cli("lower", "llama", "--backend", "vulkan", "-o", out, "--report", rep)
    assert code == 0, stderr
    match = re.search(r"^partitions: (\d+) \(delegated (\d+) nodes\)", stdout, re.M)
    assert match and int(match.group(1)) >= 1 and int(match.group(2)) > 0
    assert re.search(r"^\s+\S+\s+VulkanBackend\s+\d+ nodes", stdout, re.M)
    assert "VulkanBackend" in delegate_ids(out.read_bytes())
    data = json.loads(rep.read_text())
    assert any(p["backend_id"] == "VulkanBackend" for p in data["partitions"])


