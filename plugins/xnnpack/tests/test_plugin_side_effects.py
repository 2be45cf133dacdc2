"""A plugin's import is code edgeplug does not own (issue 47): what it does to the process is undone and
named. A plugin that sets torch's default dtype to float64 at import (and adds nothing to xnnpack) turned
another backend's lowering of ``mlp`` into 0 partitions, exit 0, naming no plugin; a plugin that printed at
import wrote into a .pte streamed to stdout."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from edgeplug._registry import lookup as plugins

PLUGIN = (
    "import torch\n"
    "print('hello from the plugin')\n"
    "torch.set_default_dtype(torch.float64)\n"
    "from edgeplug.plugin import hookimpl\n"
    "@hookimpl\n"
    "def edgeplug_backends():\n"
    "    return []\n"
)


@pytest.fixture
def rude_plugin(edgeplug_plain_env, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rude_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("EDGEPLUG_REGISTER_PLUGINS", "rude_plugin")
    plugins.reset()
    before = torch.get_default_dtype()
    yield tmp_path
    torch.set_default_dtype(before)  # whatever happened, the rest of the session runs in float32
    plugins.reset()


def test_a_plugin_changing_the_default_dtype_at_import_is_undone_and_named(cli, rude_plugin):
    code, stdout, stderr = cli("lower", "mlp", "-b", "xnnpack", "-q", "-o", rude_plugin / "m.pte")
    assert code == 0, stderr
    assert torch.get_default_dtype() == torch.float32
    warning = next(x for x in stderr.splitlines() if "default dtype" in x)
    assert warning.startswith("edgeplug: warning: ")
    assert "rude_plugin.py:3" in warning and "put it back to torch.float32" in warning
    assert "partitions: 1 " in stdout
    assert "hello from the plugin" not in stdout  # a plugin's prints go to stderr


def test_a_plugin_printing_at_import_leaves_a_pte_streamed_to_stdout_whole(rude_plugin):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(rude_plugin), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run(
        [sys.executable, "-m", "edgeplug._cli", "lower", "mlp", "-b", "xnnpack", "-q", "-o", "-"],
        capture_output=True, env=env, cwd=rude_plugin, timeout=600,
    )
    assert p.returncode == 0, p.stderr.decode()
    assert b"hello from the plugin" in p.stderr and b"hello from the plugin" not in p.stdout
    assert p.stdout[4:8] == b"ET12"  # the program's own bytes from the first one: the flatbuffer's identifier
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    _load_for_executorch_from_buffer(p.stdout)
