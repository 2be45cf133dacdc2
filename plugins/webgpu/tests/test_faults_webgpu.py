"""Fault injection on webgpu: a host kernel that raises at verification names the stage and its plugin.

Moved from the core's tests/test_faults.py (issue 23). That a corrupted weight fails --verify is the
conformance suite's test_verification_fails_on_a_corrupted_weight (test_backend.py runs it for webgpu).
"""

from __future__ import annotations

import pytest

import edgeplug
from edgeplug.testing import assert_no_traceback, error_line


@pytest.fixture(autouse=True)
def _in_tmp_path(edgeplug_plain_env, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)


class RaisingKernel:
    """A host kernel for webgpu's gelu that raises (a plugin bug at verification)."""

    @staticmethod
    def impl(*args, **kwargs):
        raise RuntimeError("dispatch table overflow")

    @edgeplug.hookimpl
    def edgeplug_kernels(self):
        yield edgeplug.Kernel(backend="webgpu", op="aten.gelu.default", impl=self.impl, device="cpu")


def test_a_kernel_that_raises_names_the_stage_and_plugin(edgeplug_cli, edgeplug_register, tmp_path):
    edgeplug_register(RaisingKernel(), name="linear-kernel-plugin")
    out = tmp_path / "m.pte"
    code, stdout, stderr = edgeplug_cli("lower", "mlp", "-b", "webgpu", "--verify", "-o", out)
    assert code == 2 and stdout == ""
    first = error_line(stderr)
    assert first.startswith("edgeplug: error: stage 'verify': plugin 'linear-kernel-plugin'")
    assert "RuntimeError: dispatch table overflow" in first
    assert not out.exists()
    assert_no_traceback(stderr)
