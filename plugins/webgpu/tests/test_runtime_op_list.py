"""Whose op list decides what webgpu delegates (issue 49): the runtime the program targets.

Where a WebGPU runtime build is found (the lookup --verify uses), the ops that build registers, which its build.sh
records beside the runner (``registered_ops.json``, tools/webgpu-runtime/registered_ops.py); otherwise ExecuTorch's
release list (``WEBGPU_SUPPORTED_OPS``). The report says which, and so does ``edgeplug backends``.

No runtime is needed: a build folder is laid out in ``tmp_path`` for the lookup (its runner is a script that is
never run: these lowerings are dry runs, and nothing here verifies).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import edgeplug
from edgeplug import BackendUnavailableError

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SCAN = Path(__file__).resolve().parents[3] / "tools" / "webgpu-runtime" / "registered_ops.py"


class Mixed(torch.nn.Module):
    """relu and gelu, outside ExecuTorch's release list; sigmoid, mul and add, inside it."""

    def forward(self, x):
        return torch.nn.functional.gelu(torch.relu(x)) * torch.sigmoid(x) + x


X = (torch.randn(2, 8, generator=torch.Generator().manual_seed(0)),)
BASE = ["aten.sigmoid.default", "aten.mul.Tensor", "aten.add.Tensor"]


def _build(cache: Path, ops, *, listed_commit: str = COMMIT, raw: str | None = None) -> Path:
    """A build folder as tools/webgpu-runtime/build.sh leaves it, under ``cache`` (EDGEPLUG_CACHE_DIR); the list
    file is written from ``ops`` (or is ``raw`` text; ``ops=None``: no list file)."""
    bin_ = cache / "webgpu-runtime" / COMMIT[:7] / "bin"
    bin_.mkdir(parents=True)
    runner = bin_ / "edgeplug-webgpu-runner"
    runner.write_text("#!/bin/sh\necho 'not a runtime: this test never runs it' >&2\nexit 3\n")
    runner.chmod(0o755)
    (bin_ / "runtime.json").write_text(json.dumps({"executorch_commit": COMMIT}))
    if raw is not None:
        (bin_ / "registered_ops.json").write_text(raw)
    elif ops is not None:
        (bin_ / "registered_ops.json").write_text(
            json.dumps({"format": 1, "executorch_commit": listed_commit, "sources": 1, "ops": list(ops)}))
    return bin_ / "registered_ops.json"


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """The runtime lookup pointed at an empty cache folder (the session turns the runtime off: on here)."""
    monkeypatch.delenv("EDGEPLUG_WEBGPU_RUNNER", raising=False)
    monkeypatch.setenv("EDGEPLUG_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("listed, delegated, refused", [
    (BASE + ["aten.relu.default"], {"aten.relu.default"}, {"aten.gelu.default"}),
    (BASE + ["aten.gelu.default"], {"aten.gelu.default"}, {"aten.relu.default"}),
])
def test_a_found_builds_list_decides_and_the_report_names_it(cache, listed, delegated, refused):
    file = _build(cache, listed)
    report = edgeplug.lower(Mixed(), X, "webgpu", dry_run=True).report
    assert set(report.delegated_ops) == set(BASE) | delegated, report.to_table()
    reasons = {c.op: c.reason for c in report.cpu_nodes}
    assert set(reasons) == refused
    for op, reason in reasons.items():
        assert reason.startswith(f"ExecuTorch's WebGPU runtime does not implement {op} (the runtime built at "), reason
        assert str(file) in reason and COMMIT[:7] in reason, reason
    (note,) = [n for n in report.notes if n.startswith("webgpu delegates only")]
    assert "registers: the 4 its build at" in note and str(file.parent.parent.parent) in note and COMMIT[:7] in note
    assert "WEBGPU_SUPPORTED_OPS" not in note


def test_without_a_build_the_release_list_decides_and_the_report_says_so(cache):
    report = edgeplug.lower(Mixed(), X, "webgpu", dry_run=True).report
    assert set(report.delegated_ops) == set(BASE)
    assert {c.op for c in report.cpu_nodes} == {"aten.relu.default", "aten.gelu.default"}
    assert all("WEBGPU_SUPPORTED_OPS" in c.reason for c in report.cpu_nodes)
    (note,) = [n for n in report.notes if n.startswith("webgpu delegates only")]
    assert "WEBGPU_SUPPORTED_OPS" in note and "no WebGPU runtime build is found here" in note, note


def test_a_build_without_a_list_file_uses_the_release_list_and_says_to_rebuild(cache):
    file = _build(cache, None)
    report = edgeplug.lower(Mixed(), X, "webgpu", dry_run=True).report
    assert set(report.delegated_ops) == set(BASE)
    (note,) = [n for n in report.notes if n.startswith("webgpu delegates only")]
    assert "WEBGPU_SUPPORTED_OPS" in note and f"{file} is missing" in note and "build.sh" in note, note


@pytest.mark.parametrize("raw, says", [
    ("{not json", "is not JSON"),
    (json.dumps([1, 2]), "holds a JSON list"),
    (json.dumps({"format": 9, "executorch_commit": COMMIT, "ops": BASE}), "is in format 9"),
    (json.dumps({"format": 1, "executorch_commit": COMMIT, "ops": []}), "has no list of op names"),
    (json.dumps({"format": 1, "executorch_commit": COMMIT, "ops": ["aten.add.Tensor", 7]}), "has no list of op names"),
    (json.dumps({"format": 1, "executorch_commit": "fedcba9876", "ops": BASE}), "was recorded for ExecuTorch fedcba9876"),
])
def test_a_malformed_list_file_is_refused_naming_it_and_what_to_do(cache, edgeplug_cli, raw, says):
    file = _build(cache, None, raw=raw)
    with pytest.raises(BackendUnavailableError) as err:
        edgeplug.lower(Mixed(), X, "webgpu", dry_run=True)
    text = str(err.value)
    assert f"the op list of ExecuTorch's WebGPU runtime build {file} {says}" in text, text
    assert "tools/webgpu-runtime/build.sh" in text and "registered_ops.py" in text and "=off" in text, text
    assert "nothing was done" in text, text  # refused before any work, dry runs included
    code, out, _ = edgeplug_cli("backends", "--no-adapter", "--no-probe")
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("webgpu "))
    assert f"no: the op list of ExecuTorch's WebGPU runtime build {file}" in row, out
    assert "webgpu support: webgpu refuses to lower:" in out, out


def test_backends_says_which_list_a_lowering_would_use(cache, edgeplug_cli):
    code, out, _ = edgeplug_cli("backends", "--no-adapter", "--no-probe")
    assert code == 0 and "webgpu support: webgpu delegates only the ops in ExecuTorch" in out, out
    file = _build(cache, BASE)
    code, out, _ = edgeplug_cli("backends", "--no-adapter", "--no-probe")
    assert code == 0, out
    assert f"webgpu support: webgpu delegates only the ops ExecuTorch's WebGPU runtime registers: the 3 its build at {file.parent.parent}" in out, out


# ---- the scan build.sh runs ---------------------------------------------------------------------

def test_the_scan_records_what_the_compiled_sources_register(tmp_path):
    """Only the sources compiled into the backend count; a registration in a comment, a string or the macro's
    definition does not; one spread over lines does."""
    src, build = tmp_path / "src", tmp_path / "build"
    (src / "ops").mkdir(parents=True)
    (src / "ops" / "Add.cpp").write_text(
        "WEBGPU_REGISTER_OPERATORS {\n  WEBGPU_REGISTER_OP(aten.add.Tensor, add_impl);\n"
        "  WEBGPU_REGISTER_OP(\n      et_vk.rms_norm.default,\n      rms_norm_impl);\n"
        "  // WEBGPU_REGISTER_OP(aten.relu.default, relu_impl);\n"
        "  /* WEBGPU_REGISTER_OP(aten.gelu.default, gelu_impl); */\n"
        '  const char* s = "WEBGPU_REGISTER_OP(aten.tanh.default, x)";\n}\n')
    (src / "ops" / "Registry.h").write_text("#define WEBGPU_REGISTER_OP(name, function) register_op(#name)\n")
    (src / "ops" / "NotBuilt.cpp").write_text("WEBGPU_REGISTER_OP(aten.mm.default, mm_impl);\n")
    (build / "build").mkdir(parents=True)
    (build / "build" / "compile_commands.json").write_text(json.dumps([
        {"directory": str(src), "file": "ops/Add.cpp",
         "command": "c++ -o backends/webgpu/CMakeFiles/webgpu_backend.dir/ops/Add.cpp.o -c ops/Add.cpp"},
        {"directory": str(src), "file": "ops/NotBuilt.cpp",
         "command": "c++ -o backends/other/CMakeFiles/other.dir/ops/NotBuilt.cpp.o -c ops/NotBuilt.cpp"},
    ]))
    out = subprocess.run([sys.executable, str(SCAN), str(build), "--commit", COMMIT], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    data = json.loads((build / "bin" / "registered_ops.json").read_text())
    assert data == {"format": 1, "executorch_commit": COMMIT, "sources": 1,
                    "ops": ["aten.add.Tensor", "et_vk.rms_norm.default"]}


def test_the_scan_refuses_a_folder_that_is_not_a_build(tmp_path):
    out = subprocess.run([sys.executable, str(SCAN), str(tmp_path), "--commit", COMMIT], capture_output=True, text=True)
    assert out.returncode != 0 and "compile_commands.json does not exist" in out.stderr, out.stderr
    assert not (tmp_path / "bin" / "registered_ops.json").exists()
