"""The `edgeplug` command line, run in-process (``cli`` fixture) on real lowerings to the fixture backends.

What the command line says about one first-party backend (its row, its SDK variable, its lowering of the
demo models) is that plugin's test: plugins/<backend>/tests/test_cli_<backend>.py.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import edgeplug
from edgeplug._registry import lookup as plugins


#: the backend the cases that only need some lowering use (a fixture backend: those cases ask for fixture_backends)
BACKEND = "fixture-table"


@pytest.fixture(autouse=True)
def _clean(clean_plugin_env, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # a default output path would land here, not in the checkout
    plugins.reset()


def _delegate_ids(pte: bytes) -> set[str]:
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte).program
    return {d.id for plan in program.execution_plan for d in plan.delegates}


MODELS = textwrap.dedent(
    '''
    import torch


    class Twice(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.relu(x) * 2


    class Branchy(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: torch.export refuses it
                return x + 1
            return x - 1


    def make():
        return Twice(), (torch.randn(4, 8),)


    def branchy():
        return Branchy(), (torch.randn(4, 8),)


    def not_a_pair():
        return Twice()


    def not_a_model():
        return "model.bin", (torch.randn(4, 8),)


    def raises():
        raise FileNotFoundError("weights.bin")


    def exits():
        import sys

        sys.exit(0)  # e.g. argparse in a script reused as a model file


    NOT_CALLABLE = 3
    '''
)


@pytest.fixture
def models(tmp_path) -> Path:
    path = tmp_path / "models.py"
    path.write_text(MODELS)
    return path


# -- backends, examples --------------------------------------------------------------


def test_backends_lists_each_with_distribution_version_and_availability(cli, fixture_backends):
    code, out, err = cli("backends")
    assert code == 0, err
    header, *rows = out.split("\n\n")[0].splitlines()  # the table ends at the first blank line (notes follow)
    assert header.split() == ["backend", "distribution", "version", "verify", "serializes", "here"]
    table = {r.split()[0]: r for r in rows if r.strip()}
    assert set(table) == set(edgeplug.backends()) >= set(fixture_backends.ALL)
    for name in table:  # an installed backend's distribution and version, or <registered> for one registered in-process
        backend = edgeplug.get_backend(name)
        assert table[name].split()[1] == (backend.distribution or "<registered>"), table[name]
    assert table["fixture-fused"].split() == ["fixture-fused", "<registered>", "kernels", "yes"]
    assert table["fixture-table"].split() == ["fixture-table", "<registered>", "none", "yes"]
    assert table["fixture-offline"].split(None, 3)[3] == "no: the fixture SDK is not installed (fixture-offline never serializes)"
    assert err == ""


def test_backends_shows_a_third_party_distribution(cli, fixture_site):
    fixture_site("good")
    code, out, _ = cli("backends")
    assert code == 0
    row = next(r for r in out.splitlines() if r.startswith("tinycpu"))
    assert row.split()[:4] == ["tinycpu", "edgeplug-fixture-good", "1.2.3", "kernels"]


def test_backends_reports_a_broken_plugin_and_lists_the_rest(cli, fixture_site):
    fixture_site("good", "broken_import")
    code, out, err = cli("backends")
    assert code == 0
    assert re.search(r"^tinycpu\b", out, re.M) and "brokenimport" not in out
    assert "broken plugin: plugin 'brokenimport' (entry point 'brokenimport = edgeplug_fixture_broken.hooks'" in err
    assert "EDGEPLUG_DISABLE_PLUGINS=brokenimport" in err


def test_backends_with_a_conflict_lists_the_others_and_names_both_distributions(cli, fixture_site):
    others = set(edgeplug.backends())
    plugins.reset()
    fixture_site("good", "conflict_backend")
    code, out, err = cli("backends")
    assert code == 0
    listed = {line.split()[0] for line in out.splitlines()[1:] if line.strip() and not line.startswith(("wgpu", "runs on:"))}
    assert others and listed == others  # every backend but the contested one
    assert "unavailable backend: backend 'tinycpu' is unavailable: backend 'tinycpu' is registered twice" in err
    assert "edgeplug-fixture-good" in err and "edgeplug-fixture-tinycpu-clone" in err


def test_backends_fails_when_the_only_plugin_is_broken(cli, fixture_site, monkeypatch):
    fixture_site("broken_import")
    monkeypatch.setenv("EDGEPLUG_PLUGINS", "brokenimport")
    code, out, err = cli("backends")
    assert code == 1
    assert "broken plugin: plugin 'brokenimport'" in err
    assert "no backend is available: every installed plugin that registers one failed" in err
    assert "pip install" not in out + err


def test_backends_says_what_is_skipped(cli, fixture_site, monkeypatch):
    fixture_site("good")
    monkeypatch.setenv("EDGEPLUG_DISABLE_PLUGINS", "tinycpu")
    code, out, err = cli("backends")
    assert code == 0 and not re.search(r"^tinycpu\b", out, re.M)
    assert "skipped plugin 'tinycpu' (edgeplug-fixture-good): blocked by EDGEPLUG_DISABLE_PLUGINS=tinycpu" in err


def test_backends_names_the_wgpu_adapter_host_verification_uses(cli, monkeypatch):
    code, out, _ = cli("backends", "--adapter")
    assert code == 0
    line = next(l for l in out.splitlines() if l.startswith("wgpu adapter: "))
    assert "max storage binding" in line  # a real adapter (llvmpipe here, a GPU where there is one)
    monkeypatch.setenv("EDGEPLUG_WGPU_ADAPTER", "none")  # the façade keeps a device per adapter choice
    try:
        code, out, _ = cli("backends", "--adapter")
        assert code == 0 and "wgpu adapter: none (" in out
        code, out, _ = cli("backends")  # the listing alone opens no adapter
        assert code == 0 and "wgpu adapter" not in out
    finally:
        monkeypatch.delenv("EDGEPLUG_WGPU_ADAPTER")


def test_examples_lists_the_built_in_models(cli):
    from edgeplug._models import MODELS

    code, out, _ = cli("examples")
    assert code == 0
    names = [line.split()[0] for line in out.splitlines()]
    assert names == list(MODELS) and names[:3] == ["handwritten-llama-decoder", "handwritten-gemma-block", "handwritten-mlp"]
    decoder, block, mlp = out.splitlines()[:3]
    assert "RMSNorm" in decoder and "SwiGLU" in decoder and decoder.endswith("[also: llama, deprecated]")
    assert block.endswith("[also: gemma-block]") and mlp.endswith("[also: mlp]")


def test_console_script_is_installed():
    exe = Path(sys.executable).with_name("edgeplug")
    proc = subprocess.run([str(exe), "examples"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("handwritten-llama-decoder ")


# -- model names: one name, one model --------------------------------------------------

DEPRECATED_LLAMA = (
    "edgeplug: deprecated: `llama` in `edgeplug lower` is `handwritten-llama-decoder`; the short name is deprecated "
    "because `edgeplug zoo` names another model by it (transformers-llama), and goes in edgeplug 0.2"
)


@pytest.mark.parametrize("name", ["handwritten-llama-decoder", "llama"])
def test_lower_takes_the_registry_name_and_the_deprecated_short_one_says_so_once(cli, tmp_path, fixture_backends, name):
    rep = tmp_path / "r.json"
    code, stdout, stderr = cli("lower", name, "-b", fixture_backends.FUSED, "--dry-run", "--report", rep)
    assert code == 0, stderr
    assert stderr.count("deprecated") == (2 if name == "llama" else 0), stderr  # the line says it twice
    assert (DEPRECATED_LLAMA in stderr.splitlines()) == (name == "llama"), stderr
    data = json.loads(rep.read_text())
    assert data["model"] == name and data["summary"]["partitions"] >= 1  # the same decoder under both names
    assert data["summary"]["delegated_nodes"] > 100  # the decoder, not the 5 nodes of the MLP


def test_lower_takes_a_registry_name_of_another_family(cli, tmp_path, fixture_backends):
    code, stdout, stderr = cli("lower", "transformers-llama", "-b", fixture_backends.FUSED, "--dry-run", "-q")
    assert code == 0 and stderr == "", stderr
    assert f"edgeplug lowering report: transformers-llama -> {fixture_backends.FUSED}" in stdout


def test_a_deprecated_model_name_fails_naming_the_new_one_once_its_api_is_gone(cli, fixture_backends, monkeypatch):
    from edgeplug import _api

    monkeypatch.setattr(_api, "current", _api.API_VERSION + 1)
    code, stdout, stderr = cli("lower", "llama", "-b", fixture_backends.FUSED, "--dry-run")
    assert code == 2 and stdout == ""
    assert stderr == (
        "edgeplug: error: `llama` in `edgeplug lower` was `handwritten-llama-decoder`; the short name was removed in "
        "plugin API 2 (edgeplug 0.2) because `edgeplug zoo` names another model by it (transformers-llama): write "
        "`edgeplug lower handwritten-llama-decoder`\n"
    )


# -- lower ---------------------------------------------------------------------------


def test_lower_mlp_verifies_and_writes_pte_and_report(cli, tmp_path, fixture_backends):
    backend = fixture_backends.FUSED  # verified on host kernels
    out, rep = tmp_path / "out" / "mlp.pte", tmp_path / "reports" / "mlp.json"
    code, stdout, stderr = cli("lower", "mlp", "--backend", backend, "--verify", "-o", out, "--report", rep)
    assert code == 0, stderr
    # progress, stage by stage, on stderr
    for stage in ("export", "to_edge", "serialize .pte", "verify"):
        assert f"[{backend}] {stage} ..." in stderr
    # the table
    assert f"edgeplug lowering report: mlp -> {backend} [<registered>]" in stdout
    assert "partitions: 1 (delegated 5 nodes)" in stdout
    assert f"wrote {out} ({out.stat().st_size:,} bytes)" in stdout
    diff = float(re.search(r"max \|difference\| vs eager = (\S+)", stdout).group(1))
    assert diff < 1e-4
    # the .pte is real: executorch reads it back and it names the delegate
    backend_id = fixture_backends.BACKEND_IDS[backend]
    assert _delegate_ids(out.read_bytes()) == {backend_id}
    # the JSON report
    data = json.loads(rep.read_text())
    assert data["backend"] == backend and data["model"] == "mlp" and data["dry_run"] is False
    assert data["output_path"] == str(out) and data["output_bytes"] == out.stat().st_size
    assert data["summary"] == {
        "partitions": 1, "delegated_nodes": 5, "cpu_nodes": 0, "max_abs_diff": pytest.approx(diff, rel=1e-3), "verified": True
    }
    check = data["verification"]["outputs"][0]
    assert check["tolerance"] == 1e-4 and check["tolerance_reason"] == "default for float32 outputs"
    assert check["problems"] == [] and check["dtype"] == "float32"
    assert [p["backend_id"] for p in data["partitions"]] == [backend_id]
    assert {s["stage"] for s in data["stages"]} >= {"export", "to_edge", "serialize .pte", "verify"}
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["mlp.json", "mlp.pte"]


@pytest.mark.parametrize("tolerance", ["-1", "nan", "inf", "-inf", "lots"])
def test_a_tolerance_that_is_not_a_finite_number_at_least_zero_is_refused(cli, tmp_path, tolerance, fixture_backends):
    # `--tolerance nan` used to be accepted and let any difference through (nan compares false)
    out = tmp_path / "mlp.pte"
    code, stdout, stderr = cli("lower", "mlp", "-b", fixture_backends.FUSED, "--verify", f"--tolerance={tolerance}", "-o", out)
    assert code == 2 and stdout == ""
    assert "argument --tolerance" in stderr
    assert "finite number >= 0" in stderr or "is not a number" in stderr
    assert not out.exists()


def test_lower_takes_a_tolerance_only_if_it_is_finite_and_not_negative(fixture_backends):
    from edgeplug._errors import EdgeplugError
    from edgeplug.examples import load_model

    model, inputs, _, _ = load_model("mlp")
    for bad in (float("nan"), float("inf"), -1e-9):
        with pytest.raises(EdgeplugError, match="tolerance must be a finite number >= 0"):
            edgeplug_lower(model, inputs, fixture_backends.FUSED, verify=True, tolerance=bad)


def edgeplug_lower(*args, **kwargs):
    import edgeplug

    return edgeplug.lower(*args, **kwargs)


def test_dry_run_of_a_backend_without_its_sdk_writes_the_report_and_no_pte(cli, tmp_path, fixture_backends):
    rep = tmp_path / "offline.json"
    code, stdout, stderr = cli("lower", "mlp", "-b", fixture_backends.OFFLINE, "--dry-run", "-o", tmp_path / "mlp.pte", "--report", rep)
    assert code == 0, stderr
    assert "(dry run: nothing serialized)" in stdout
    assert "would delegate" in stdout
    assert f"--dry-run: {tmp_path / 'mlp.pte'} was not written" in stdout
    assert not list(tmp_path.rglob("*.pte"))
    data = json.loads(rep.read_text())
    assert data["dry_run"] is True and data["output_path"] is None
    backend_id = fixture_backends.BACKEND_IDS[fixture_backends.TABLE]
    assert data["partitions"] and all(p["backend_id"] == backend_id for p in data["partitions"])


def test_a_backend_without_its_sdk_says_why_and_offers_a_dry_run(cli, tmp_path, fixture_backends):
    backend = fixture_backends.OFFLINE
    code, stdout, stderr = cli("lower", "mlp", "--backend", backend, "-o", tmp_path / "m.pte")
    assert code == 2
    assert stdout == ""
    assert stderr.startswith(f"edgeplug: error: backend '{backend}' cannot serialize its delegate here")
    assert "(fixture-offline never serializes)" in stderr and "lower with dry_run=True, or pick fixture-table" in stderr
    assert "Use --dry-run" in stderr
    assert not list(tmp_path.rglob("*.pte"))


def test_unknown_backend(cli):
    code, stdout, stderr = cli("lower", "mlp", "--backend", "tpu")
    assert code == 2 and stdout == ""
    assert "edgeplug: error: no backend named 'tpu'" in stderr
    assert f"Installed backends: {', '.join(sorted(edgeplug.backends()))}" in stderr


def test_unknown_example(cli, fixture_backends):
    from edgeplug._models import MODELS

    code, _, stderr = cli("lower", "handwriten-mlp", "--backend", BACKEND)
    assert code == 2 and len(stderr.splitlines()) == 1, stderr
    names = ", ".join([*MODELS, "gemma-block", "mlp"])  # every registry name, and the short names not deprecated
    assert stderr == (
        f"edgeplug: error: unknown model 'handwriten-mlp' (did you mean 'handwritten-mlp'?): use one of {names}, "
        "or FILE.py:ATTR\n"
    )


@pytest.mark.parametrize(
    "attr, message",
    [
        ("missing", "models.py has no callable 'missing'; it must define a function returning (model, args) or (model, args, kwargs)"),
        ("NOT_CALLABLE", "models.py has no callable 'NOT_CALLABLE'"),
        ("not_a_pair", "models.py:not_a_pair returned Twice, expected a tuple (model, args) or (model, args, kwargs)"),
        ("not_a_model", "models.py:not_a_model returned a model of type str, expected a tuple (model, args) or (model, args, kwargs)"),
        ("raises", "calling {path}:raises failed: FileNotFoundError: weights.bin"),
    ],
)
def test_model_file_attr_that_is_wrong(cli, models, attr, message, fixture_backends):
    code, stdout, stderr = cli("lower", f"{models}:{attr}", "--backend", BACKEND)
    assert code == 2 and stdout == ""
    assert message.format(path=models) in stderr


def test_model_file_that_does_not_exist(cli, tmp_path, fixture_backends):
    code, _, stderr = cli("lower", f"{tmp_path / 'nope.py'}:make", "--backend", BACKEND)
    assert code == 2
    assert f"model file '{tmp_path / 'nope.py'}' does not exist" in stderr


def test_model_file_attr_lowers(cli, models, tmp_path, fixture_backends):
    rep = tmp_path / "r.json"
    code, stdout, stderr = cli("lower", f"{models}:make", "-b", BACKEND, "--dry-run", "--report", rep, "-q")
    assert code == 0, stderr
    assert stderr == ""  # -q: no progress lines
    data = json.loads(rep.read_text())
    assert data["model"] == f"{models}:make"
    assert data["delegated_ops"] == {"aten.relu.default": 1, "aten.mul.Tensor": 1}


def test_a_build_function_that_calls_sys_exit_is_an_error_not_a_silent_exit(cli, models, fixture_backends):
    code, stdout, stderr = cli("lower", f"{models}:exits", "-b", BACKEND)
    assert code == 2 and stdout == ""
    line = next(i for i, text in enumerate(MODELS.splitlines(), 1) if "sys.exit(0)" in text)
    last = stderr.splitlines()[-1]
    assert last.startswith(f"edgeplug: error: calling {models}:exits failed: it called sys.exit(0) at "), last
    assert last.endswith(f"models.py:{line}, in exits; a model file must return (model, args), not exit"), last


def test_a_model_file_imports_its_siblings_and_the_cli_says_it_runs_the_file(cli, tmp_path, fixture_backends):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "blocks.py").write_text("import torch\nclass Twice(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n")
    (tmp_path / "pkg" / "model.py").write_text(
        "import torch\nfrom blocks import Twice  # a sibling, as `python model.py` finds it\n"
        "def make():\n    return Twice(), (torch.randn(2, 4),)\n"
    )
    code, _, stderr = cli("lower", f"{tmp_path / 'pkg' / 'model.py'}:make", "-b", BACKEND, "--dry-run")
    assert code == 0, stderr
    assert f"executing {tmp_path / 'pkg' / 'model.py'} (a model file is run as Python code), then calling make()" in stderr


def test_an_empty_plugin_allow_list_means_unset(cli, monkeypatch):
    installed = set(edgeplug.backends())
    assert installed, "no backend is installed: install a plugin (make setup installs plugins/*)"
    monkeypatch.setenv("EDGEPLUG_PLUGINS", "")
    plugins.reset()
    code, out, err = cli("backends", "--no-adapter")
    assert code == 0, err
    assert {r.split()[0] for r in out.splitlines()[1:] if r.strip() and not r.startswith("runs on:")} == installed


# -- atomic writes -----------------------------------------------------------------


def test_failed_export_leaves_an_existing_pte_untouched(cli, models, tmp_path, fixture_backends):
    out = tmp_path / "model.pte"
    out.write_bytes(b"the previous program")
    code, stdout, stderr = cli("lower", f"{models}:branchy", "-b", BACKEND, "-o", out, "--report", tmp_path / "r.json")
    assert code == 2 and stdout == ""
    assert f"edgeplug: error: stage 'export' failed for backend '{BACKEND}' in the model: " in stderr
    # besides the progress lines, one line: torch.export's printout of the partial graph stays behind --debug
    assert len([l for l in stderr.splitlines() if l.strip() and not re.match(r"^\s*\d+\.\ds ", l)]) == 1
    assert out.read_bytes() == b"the previous program"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pte", "models.py"]


def test_failed_write_leaves_no_partial_file_and_does_not_clobber(cli, tmp_path, monkeypatch, fixture_backends):
    out = tmp_path / "mlp.pte"
    out.write_bytes(b"the previous program")

    def disk_full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)  # the data is written, the flush to disk fails
    code, stdout, stderr = cli("lower", "mlp", "-b", BACKEND, "-o", out, "-q")
    assert code == 74, stderr  # a full disk is the environment's: the README's 74 (issue 47)
    assert f"edgeplug: error: cannot write {out}: No space left on device; nothing was written" in stderr
    assert out.read_bytes() == b"the previous program"
    assert [p.name for p in tmp_path.iterdir()] == ["mlp.pte"]


@pytest.mark.parametrize(
    "stdout, code, stderr",
    [("closed pipe", 141, ""), ("/dev/full", 74, "edgeplug: output failed: No space left on device\n")],
)
def test_a_pte_written_to_a_stdout_that_fails_ends_with_the_streams_code(tmp_path, stdout, code, stderr):
    """`lower -o -` into a closed pipe or a full device is the environment's failure, as for any command:
    its exit code and at most one line, not "unexpected NameError: this is a bug in edgeplug"."""
    import edgeplug_fixture_backends

    if stdout == "closed pipe":
        read, target = os.pipe()
        os.close(read)
    else:
        target = os.open("/dev/full", os.O_WRONLY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEPLUG_")}
    env["EDGEPLUG_REGISTER_PLUGINS"] = "edgeplug_fixture_backends"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(edgeplug_fixture_backends.__file__).parent), env.get("PYTHONPATH")]))
    try:
        p = subprocess.run([sys.executable, "-m", "edgeplug._cli", "lower", "mlp", "-b", BACKEND, "-q", "-o", "-"],
                           stdout=target, stderr=subprocess.PIPE, timeout=300, cwd=tmp_path, env=env)
    finally:
        os.close(target)
    assert (p.returncode, p.stderr.decode()) == (code, stderr)
    assert list(tmp_path.iterdir()) == []


def test_output_path_that_is_a_directory_is_refused_cleanly(cli, tmp_path, fixture_backends):
    target = tmp_path / "out"
    target.mkdir()
    code, _, stderr = cli("lower", "mlp", "-b", BACKEND, "-o", target, "-q")
    assert code == 2
    assert stderr == f"edgeplug: error: cannot write the .pte {target}: it is a directory; name a file inside it\n"
    assert list(tmp_path.rglob("*")) == [target]
