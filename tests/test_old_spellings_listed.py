"""`edgeplug plugins` lists every old spelling a previous-API plugin uses (issue 47): a plugin named in
EDGEPLUG_REGISTER_PLUGINS was imported before the registry watched it, so the spellings of its imports were
warned on stderr but left out of its `deprecated` lines (2 of 5 were listed)."""

from __future__ import annotations

import pytest

from edgeplug._registry import lookup as plugins

OLD_API = '''
from edgeplug.records import BackendSpec, KeepWhole
from edgeplug.hookspecs import hookimpl


@hookimpl
def edgeplug_backends():
    yield BackendSpec(backend="oldnpu", description="old", backend_id="OldNpu", partitioner=lambda: None, verify="none")


@hookimpl
def edgeplug_skip_decomp():
    import torch
    yield KeepWhole(backend="oldnpu", ops=(torch.ops.aten.linear.default,))
'''

SPELLINGS = (
    "`edgeplug.records.BackendSpec`", "`edgeplug.records.KeepWhole`", "`edgeplug.hookspecs.hookimpl`",
    "`BackendSpec(verify=)`", "`edgeplug_skip_decomp`",
)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_every_old_spelling_of_a_plugin_named_in_the_variable_is_listed(cli, edgeplug_plain_env, monkeypatch, tmp_path):
    (tmp_path / "old_api_issue47.py").write_text(OLD_API)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("EDGEPLUG_REGISTER_PLUGINS", "old_api_issue47")
    plugins.reset()
    try:
        code, stdout, _ = cli("plugins")
    finally:
        plugins.reset()
    assert code == 0
    block = stdout.split("old_api_issue47:", 1)[1].split("\n\n")[0].split("\n  adds to")[0]
    listed = [line for line in block.splitlines() if line.strip().startswith("deprecated")]
    for spelling in SPELLINGS:
        assert any(spelling in line for line in listed), (spelling, listed)
    assert len(listed) == len(SPELLINGS)
