"""The `edgeplug` command line on the vulkan backend (the command line itself is the core's tests/test_cli.py).

`make demo`'s lowering (llama on vulkan: partitions delegated to VulkanBackend, a .pte executorch reads
back naming it) is the conformance suite's test_llama_lowers, run for vulkan by test_backend.py.
"""

from __future__ import annotations

import pytest

from edgeplug.testing import backends_row

pytestmark = pytest.mark.usefixtures("edgeplug_plain_env", "_in_tmp_path")


@pytest.fixture
def _in_tmp_path(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)


def test_backends_row(edgeplug_cli):
    code, out, err = edgeplug_cli("backends", "--no-adapter")
    assert code == 0, err
    assert backends_row(out, "vulkan").split()[:5] == ["vulkan", "edgeplug-vulkan", "0.1.0", "kernels", "yes"]
