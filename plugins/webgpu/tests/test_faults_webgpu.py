"""Fault injection on webgpu: a corrupted weight fails --verify; a host kernel that raises at verification
names the stage and its plugin.

Moved from the core's tests/test_faults.py (issue 23).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import edgeplug


@pytest.fixture
def cli(capsys):
    """Run ``edgeplug ARGS...`` in this process: returns (exit code, stdout, stderr)."""
    from edgeplug._cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse usage errors
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture(autouse=True)
def _clean(monkeypatch, tmp_path):
    for var in ("EDGEPLUG_PLUGINS", "EDGEPLUG_DISABLE_PLUGINS", "EDGEPLUG_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _no_traceback(stderr: str) -> None:
    assert "Traceback (most recent call last)" not in stderr, stderr


def _first_line(stderr: str) -> str:
    lines = [l for l in stderr.splitlines() if l.startswith("edgeplug: error:")]
    assert len(lines) == 1, stderr
    return lines[0]


class CorruptWeight:
    """An export-stage pass on ``backends`` that corrupts fc1's weight of the mlp example."""

    def __init__(self, backends: tuple[str, ...], how: str) -> None:
        self.backends, self.how = backends, how

    def corrupt(self, ep):
        key = next(k for k in ep.state_dict if k.endswith("fc1.weight"))
        w = ep.state_dict[key].detach().clone()
        if self.how == "nan":
            w[0, 0] = float("nan")
        else:
            w = w * 1.01
        # in place, as a careless pass would: a program that shares the caller's tensors passes it on
        ep.state_dict[key].data.copy_(w) if self.how == "inplace" else ep.state_dict.__setitem__(key, torch.nn.Parameter(w, requires_grad=False))
        return ep

    @edgeplug.hookimpl
    def edgeplug_passes(self):
        for b in self.backends:
            yield edgeplug.PassSpec(backend=b, stage="export", name=f"corrupt-{self.how}", fn=self.corrupt)


class RaisingKernel:
    """A host kernel for webgpu's gelu that raises (a plugin bug at verification)."""

    @staticmethod
    def impl(*args, **kwargs):
        raise RuntimeError("dispatch table overflow")

    @edgeplug.hookimpl
    def edgeplug_kernels(self):
        yield edgeplug.Kernel(backend="webgpu", op="aten.gelu.default", impl=self.impl, device="cpu")


@pytest.mark.parametrize("how", ["nan", "scale"])
def test_verify_fails_on_a_corrupted_weight(cli, edgeplug_register, tmp_path, how):
    backend = "webgpu"
    edgeplug_register(CorruptWeight((backend,), how), name="corrupter")
    out, rep = tmp_path / "m.pte", tmp_path / "m.json"
    code, stdout, stderr = cli("lower", "mlp", "-b", backend, "--verify", "-o", out, "--report", rep, "-q")
    assert code == 3, stderr
    first = _first_line(stderr)
    assert first.startswith("edgeplug: error: verification failed: output 0: ")
    if how == "nan":
        assert "NaN where eager has none" in first
    else:
        assert "max |difference|" in first and "> tolerance 1.000e-04" in first
    assert first.endswith("no .pte was written")
    assert not out.exists() and _files(tmp_path) == ["m.json"]
    # the report is strict JSON and says why
    data = json.loads(rep.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c} in the report"))
    assert data["summary"]["verified"] is False and data["output_path"] is None
    assert data["verification"]["outputs"][0]["problems"]
    _no_traceback(stderr)


def test_a_kernel_that_raises_names_the_stage_and_plugin(cli, edgeplug_register, tmp_path):
    edgeplug_register(RaisingKernel(), name="linear-kernel-plugin")
    out = tmp_path / "m.pte"
    code, stdout, stderr = cli("lower", "mlp", "-b", "webgpu", "--verify", "-o", out)
    assert code == 2 and stdout == ""
    first = _first_line(stderr)
    assert first.startswith("edgeplug: error: stage 'verify': plugin 'linear-kernel-plugin'")
    assert "RuntimeError: dispatch table overflow" in first
    assert not out.exists()
    _no_traceback(stderr)
