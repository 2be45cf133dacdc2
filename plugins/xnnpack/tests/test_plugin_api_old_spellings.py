"""The plugin API's version and its renames (``edgeplug._api``), through real plugin loading and the CLI.

The fixture ``plugins/xnnpack/tests/fixtures/old_api`` is a backend over XNNPACK's partitioner
written against plugin API 0 (before the boundary redesign): ``verify=``,
``edgeplug.partition``, ``edgeplug.graph.ops``, ``edgeplug.records``. Its
distribution states ``Requires-Dist: edgeplug<0.1``. Each case runs the CLI in
a process of its own, as an author would (a module path imported once stays
imported), with only the fixture and xnnpack allowed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import edgeplug
from edgeplug import _api

ROOT = Path(__file__).resolve().parents[3]
#: old_api lives beside this file (it is a backend over XNNPACK's partitioner); future_api is the core's fixture
FIXTURE_DIRS = {"old_api": Path(__file__).resolve().parent / "fixtures", "future_api": ROOT / "tests" / "fixtures"}
#: the old spellings the fixture uses, each with its replacement
OLD_SPELLINGS = {
    "edgeplug.graph.ops.op_name": "edgeplug.plugin.op_name",
    "edgeplug.partition.refuse": "edgeplug.plugin.refuse",
    "edgeplug.records.BackendSpec": "edgeplug.plugin.BackendSpec",
    "edgeplug.records.PartitionerFilter": "edgeplug.plugin.PartitionerFilter",
    "BackendSpec(verify=)": "BackendSpec(verify_method=)",
}
#: runs edgeplug's CLI with the core's API set first: ``simulate`` 2 is the next release, its removals made
DRIVER = (
    "import sys, edgeplug._api as api\n"
    "api.current = int(sys.argv[1])\n"
    "from edgeplug._cli.app import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


def _edgeplug(*args: str, sites: tuple[str, ...] = ("old_api",), api: int = _api.API_VERSION, cwd=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEPLUG_") and k != "PYTHONWARNINGS"}
    env["PYTHONPATH"] = os.pathsep.join(str(FIXTURE_DIRS[s] / s) for s in sites)
    env["EDGEPLUG_PLUGINS"] = "oldxnn,future,xnnpack"
    return subprocess.run(
        [sys.executable, "-c", DRIVER, str(api), *args],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=540,
    )


def _deprecations(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "PluginApiDeprecationWarning" in line]


def test_a_plugin_one_version_behind_lowers_llama_and_verifies_with_one_line_per_old_spelling(tmp_path):
    out = _edgeplug("lower", "handwritten-llama-decoder", "--backend", "oldxnn", "--verify", "-o", str(tmp_path / "llama.pte"), "--report", str(tmp_path / "r.json"))
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verification"]["method"] == "pte" and not report["verification"]["note"].startswith("not")
    outputs = report["verification"]["outputs"]
    assert outputs and all(o["max_abs_diff"] <= o["tolerance"] and not o["problems"] for o in outputs), report["verification"]
    assert report["partitions"], "XNNPACK's partitioner delegated nothing"
    lines = _deprecations(out.stderr)
    assert len(lines) == len(OLD_SPELLINGS), "\n".join(lines)  # once each, though the filter ran per node
    for old, new in OLD_SPELLINGS.items():
        [line] = [x for x in lines if f"`{old}` is now `{new}`" in x]
        assert "plugin 'oldxnn'" in line and "removed in API 2, edgeplug 0.2" in line
        assert "edgeplug_fixture_oldxnn.py:" in line  # the author's own line, not the core's


def test_edgeplug_plugins_shows_each_plugins_api_version_and_its_old_spellings():
    out = _edgeplug("plugins", "--json")
    assert out.returncode == 0, out.stderr
    found = {p["plugin"]: p for p in json.loads(out.stdout) if p["status"] == "loaded"}
    assert found["oldxnn"]["api_version"] == 0  # from its requirement edgeplug<0.1
    assert found["xnnpack"]["api_version"] == _api.API_VERSION
    assert sorted(re.findall(r"`([^`]+)` is now", " ".join(found["oldxnn"]["deprecated"]))) == sorted(OLD_SPELLINGS)
    assert found["xnnpack"]["deprecated"] == []
    text = _edgeplug("plugins").stdout
    assert "  plugin API   0 (this edgeplug speaks 1)" in text and "  plugin API   1\n" in text


def test_at_the_next_api_the_old_plugin_is_refused_in_one_line_naming_each_replacement():
    out = _edgeplug("backends", "--no-probe", api=2)
    assert out.returncode == 0, out.stderr
    assert [r.split()[0] for r in out.stdout.splitlines()[1:] if r.strip()][:1] == ["xnnpack"]  # the others work
    assert "oldxnn" not in out.stdout
    [line] = [x for x in out.stderr.splitlines() if x.startswith("broken plugin: plugin 'oldxnn'")]
    assert "it wants plugin API 0 (its requirement on edgeplug), this edgeplug speaks plugin API 2" in line
    for old, new in OLD_SPELLINGS.items():
        assert f"`{old}` is now `{new}` (removed in plugin API 2, edgeplug 0.2)" in line
    assert not _deprecations(out.stderr)  # refused, not warned


def test_a_plugin_wanting_a_newer_api_is_refused_in_one_line_and_the_others_keep_working():
    out = _edgeplug("backends", "--no-probe", sites=("old_api", "future_api"))
    assert out.returncode == 0, out.stderr
    assert {r.split()[0] for r in out.stdout.splitlines()[1:] if r.strip() and not r.startswith(" ")} >= {"oldxnn", "xnnpack"}
    [line] = [x for x in out.stderr.splitlines() if x.startswith("broken plugin: plugin 'future'")]
    assert "it wants plugin API 2 (BackendSpec.api_version), this edgeplug speaks plugin API 1 (edgeplug 0.1)" in line
    assert "upgrade edgeplug to 0.2 or later" in line


def test_a_removed_import_path_outside_a_plugin_names_its_replacement():
    code = "import edgeplug._api as api; api.current = 2\nfrom edgeplug.partition import refuse\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0
    assert "RemovedSpelling: `edgeplug.partition.refuse` is now `edgeplug.plugin.refuse` (removed in plugin API 2" in out.stderr
    ok = subprocess.run(
        [sys.executable, "-W", "always", "-c", "from edgeplug.graph.ops import op_name\nimport edgeplug.plugin\nassert op_name is edgeplug.plugin.op_name"],
        capture_output=True, text=True,
    )
    assert ok.returncode == 0, ok.stderr
    assert "`edgeplug.graph.ops.op_name` is now `edgeplug.plugin.op_name` (deprecated in plugin API 1" in ok.stderr


def test_the_old_record_keyword_warns_in_process_and_the_new_one_alone_is_asked_for():
    with pytest.warns(_api.PluginApiDeprecationWarning, match=r"`BackendSpec\(verify=\)` is now `BackendSpec\(verify_method=\)`"):
        spec = edgeplug.BackendSpec(backend="oldkw", description="d", backend_id="X", partitioner=lambda: None, verify="pte")
    assert spec.verify_method == "pte"
    with pytest.raises(ValueError, match="give verify_method only"):
        edgeplug.BackendSpec(backend="oldkw", description="d", backend_id="X", partitioner=lambda: None, verify="pte", verify_method="pte")


def test_the_old_hook_name_is_called_as_the_new_one_with_a_warning(edgeplug_register, recwarn):
    import types

    import torch

    plugin = types.ModuleType("edgeplug_oldhook_plugin")
    exec(
        "import edgeplug, torch\n"
        "@edgeplug.hookimpl\n"
        "def edgeplug_backends():\n"
        "    yield edgeplug.BackendSpec(backend='oldhook', description='d', backend_id='X', partitioner=lambda: None)\n"
        "@edgeplug.hookimpl\n"
        "def edgeplug_skip_decomp():\n"
        "    yield edgeplug.KeepWhole(backend='oldhook', ops=(torch.ops.aten.rms_norm.default,))\n",
        plugin.__dict__,
    )
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        edgeplug_register(plugin, "oldhook-plugin")
        backend = edgeplug.get_backend("oldhook")
    assert torch.ops.aten.rms_norm.default in backend.keep_whole
    assert any("`edgeplug_skip_decomp` is now `edgeplug_keep_whole`" in str(w.message) for w in recwarn.list)


@pytest.mark.parametrize(
    "requirement, api",
    [("edgeplug<0.1", 0), ("edgeplug==0.1.0", 1), ("edgeplug>=0.1", 1), ("edgeplug>=0.0", 1), ("edgeplug>=0.2", 2),
     ("edgeplug~=0.0.5", 0), ("edgeplug", None)],
)
def test_the_requirement_on_edgeplug_states_the_api(tmp_path, edgeplug_site, requirement, api):
    meta = tmp_path / "edgeplug_fixture_req-1.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: edgeplug-fixture-req\nVersion: 1.0\nRequires-Dist: {requirement}\n"
    )
    edgeplug_site(tmp_path)
    assert _api.required_api("edgeplug-fixture-req") == api
    assert (_api.refusal(api, "x") is None) == (api in (None, 0, 1)) if api is not None else True


def test_the_authors_changelog_is_generated_from_the_one_table():
    doc = ROOT / "docs" / "plugin-api-changes.md"
    assert doc.read_text() == _api.changelog(), (
        "docs/plugin-api-changes.md is out of date with edgeplug._api.RENAMES; regenerate it:\n"
        "  python -c \"import edgeplug._api as a; print(a.changelog(), end='')\" > docs/plugin-api-changes.md"
    )
    for r in _api.RENAMES:
        assert f"`{r.old}` | `{r.new}`" in doc.read_text()


def test_every_rename_points_at_a_name_that_exists():
    import importlib

    for r in _api.RENAMES:
        if r.kind == "import":
            module, _, name = r.new.rpartition(".")
            assert hasattr(importlib.import_module(module), name), r
        elif r.kind == "field":
            assert _api.new_field_name(r) in edgeplug.BackendSpec.model_fields, r
        elif r.kind == "model":  # a command's model name: the registry's (tests/test_model_registry.py)
            from edgeplug._models import MODELS

            assert r.new.rpartition(" ")[2] in MODELS, r
        else:
            from edgeplug._records import HOOK_RECORDS

            assert r.new in HOOK_RECORDS, r
