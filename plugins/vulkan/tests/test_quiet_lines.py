"""Quiet by default, and the listing says what --verify runs (issue 47): with -q, ExecuTorch's C++ log that its
Python runtime prints through Python's stderr (``[cpuinfo_utils.cpp:71] Reading file ...``) stays off the
terminal; `edgeplug backends --adapter` keeps the driver's own lines (Mesa's "XDG_RUNTIME_DIR is invalid")
off it; and the verify column says ``pte`` for a backend whose own runtime is found, as the runtime line
below it does (it said ``kernels``)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from edgeplug.testing import backends_row

#: a line of ExecuTorch's C++ log
NATIVE_LOG = re.compile(r"^\[[\w./-]+\.(?:cpp|cc|c|h):\d+\] ", re.M)


def test_executorchs_log_stays_off_the_terminal_with_q(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "edgeplug._cli", "lower", "mlp", "-b", "xnnpack", "--verify", "-q", "-o", "m.pte"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )
    assert p.returncode == 0, p.stderr
    assert not NATIVE_LOG.search(p.stderr), p.stderr
    assert p.stderr == "", p.stderr  # -q: nothing but edgeplug's own lines, and there are none


@pytest.mark.skipif(importlib.util.find_spec("wgpu") is None, reason="wgpu is not installed")
def test_the_adapter_probe_keeps_the_drivers_lines_off_the_terminal(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    p = subprocess.run([sys.executable, "-m", "edgeplug._cli", "backends", "--adapter"], capture_output=True,
                       text=True, cwd=tmp_path, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "XDG_RUNTIME_DIR" not in p.stderr + p.stdout
    assert "wgpu adapter:" in p.stdout


def test_the_verify_column_says_pte_where_the_backends_own_runtime_is_found(edgeplug_cli, edgeplug_plain_env, monkeypatch, tmp_path):
    runner = tmp_path / "edgeplug-vulkan-runner"
    runner.write_text("#!/bin/sh\nexit 1\n")
    runner.chmod(0o755)
    monkeypatch.setenv("EDGEPLUG_VULKAN_RUNNER", str(runner))
    code, out, err = edgeplug_cli("backends", "--no-adapter")
    assert code == 0, err
    assert backends_row(out, "vulkan").split()[3] == "pte"
    assert "(--verify runs the .pte in it)" in out
    monkeypatch.setenv("EDGEPLUG_VULKAN_RUNNER", "off")
    code, out, _ = edgeplug_cli("backends", "--no-adapter")
    assert backends_row(out, "vulkan").split()[3] == "kernels"


NOISY_PLUGIN = (
    "import logging, os, warnings\n"
    "logging.getLogger('torchao').warning('Failed to load /x/_C_mxfp8.so: undefined symbol')\n"
    "warnings.warn(\"a library's deprecation\", FutureWarning)\n"
    "os.write(2, b'native chatter\\n')\n"
    "from edgeplug.plugin import hookimpl\n"
    "@hookimpl\n"
    "def edgeplug_backends():\n"
    "    return []\n"
)


def test_lower_help_prints_no_librarys_lines(tmp_path):
    """--help loads the plugins to list their schemes, before main() quiets the libraries: what their imports
    log, warn or print themselves (torchao's 'Failed to load ..._C_mxfp8', torch's pytree warning) stays off."""
    (tmp_path / "noisy_plugin.py").write_text(NOISY_PLUGIN)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "EDGEPLUG_REGISTER_PLUGINS": "noisy_plugin"}
    p = subprocess.run([sys.executable, "-m", "edgeplug._cli", "lower", "--help"], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=300)
    assert p.returncode == 0 and "--quantize SCHEME" in p.stdout
    assert p.stderr == "", p.stderr
