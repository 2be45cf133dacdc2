"""vulkan programs in ExecuTorch's own Vulkan runtime (built from source: docs/vulkan-runtime.md).

Where no runtime is built (CI), the tests that need one skip and say why; the fallback tests run
everywhere: without a runtime, verification runs the host emulation and says why in its note.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import edgeplug
from edgeplug.plugin import RuntimeNotFound, RuntimeRefusedError

from edgeplug_vulkan_delegate.runtime import RUNNER_VARIABLE, RunnerNotFound, RunnerSession, device_runtime, find_runner

pytestmark = pytest.mark.usefixtures("real_vulkan_runtime_env")


def _runtime_or_skip():
    try:
        return device_runtime()
    except RuntimeNotFound as exc:
        pytest.skip(f"{exc} (tools/vulkan-runtime/build.sh builds one; `make vulkan-runtime` builds it and runs these)")


@pytest.fixture(scope="module")
def runtime(real_vulkan_runtime_env):
    return _runtime_or_skip()


def _norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Seed003(nn.Module):
    """The Vulkan seed's three cases: a leaf weight, a (1 + w) weight, a runtime (1 + scale)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(1 + 0.1 * torch.randn(64, generator=g))
        self.dw = nn.Parameter(0.1 * torch.randn(64, generator=g))

    def forward(self, x, scale):
        return _norm(x) * self.w, _norm(x) * (1.0 + self.dw), _norm(x) * (1 + scale)


class Cache(nn.Module):
    """A KV-cache-like program: each call adds its input into a buffer and returns the running sum."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("acc", torch.zeros(4, 16))
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        self.acc.add_(self.lin(x))
        return self.acc * 1.0


def test_cli_verify_runs_in_the_real_runtime(runtime, edgeplug_cli, tmp_path):
    """`edgeplug lower handwritten-llama-decoder --backend vulkan --verify` says ExecuTorch's Vulkan runtime ran it, within 1e-4."""
    rep = tmp_path / "r.json"
    code, out, err = edgeplug_cli("lower", "handwritten-llama-decoder", "--backend", "vulkan", "--verify", "-o", tmp_path / "l.pte",
                                  "--report", rep)
    assert code == 0, err
    assert f"pte on {runtime.name} on " in out, out
    v = json.loads(rep.read_text())["verification"]
    assert v["method"] == "pte" and v["adapter"].startswith(runtime.name), v
    worst = max(o["max_abs_diff"] for o in v["outputs"])
    assert 0 <= worst <= 1e-4, v


def test_real_runtime_agrees_with_emulation_and_eager(runtime):
    """One lowered program, both runners: each within 1e-4 of eager, and within 1e-5 of each other."""
    from edgeplug._verify.targets import run_device_runtime, run_kernels

    from edgeplug.examples import load_model

    model, args, *_ = load_model("llama")
    result = edgeplug.lower(model, args, backend="vulkan")
    real = run_device_runtime(result, runtime)
    emu = run_kernels(result, edgeplug.get_backend("vulkan"))
    eager = result.reference.outputs
    for r, e, x in zip(real.outputs, emu.outputs, eager):
        assert torch.isfinite(r).all()
        assert (r - x).abs().max().item() <= 1e-4
        assert (r - e).abs().max().item() <= 1e-5
    assert "llvmpipe" in real.adapter or "NVIDIA" in real.adapter or real.adapter


def test_seed_cases_match_eager_in_the_real_runtime(runtime):
    """The Vulkan seed's three norms, lowered by edgeplug, match eager on the device runtime."""
    g = torch.Generator().manual_seed(1)
    args = (torch.randn(1, 8, 64, generator=g), 0.1 * torch.rand(1, 1, 64, generator=g))
    result = edgeplug.lower(Seed003().eval(), args, backend="vulkan", verify=True)
    v = result.report.verification
    assert v.adapter.startswith(runtime.name)
    assert v.passed and v.max_abs_diff <= 1e-4, result.report.to_table()


def test_buffers_carry_across_calls(runtime):
    """A program that keeps state runs prefill and decode steps in one loaded program: the state carries
    (a fresh load given only the last call answers differently), and verification says it ran the steps."""
    model = Cache().eval()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(2))
    result = edgeplug.lower(model, (x,), backend="vulkan", verify=True)
    v = result.report.verification
    assert v.adapter.startswith(runtime.name)
    assert v.passed, result.report.to_table()
    assert any(o.label.startswith("decode 3") for o in v.outputs), [o.label for o in v.outputs]
    with RunnerSession(result.buffer, result.data_buffer, build=runtime.build) as s:
        first = s.run([x])[0][-1]
        second = s.run([x])[0][-1]
        s.reset()
        again = s.run([x])[0][-1]
    assert not torch.allclose(first, second)
    assert torch.allclose(first, again)


def test_a_broken_program_is_the_runtimes_refusal(runtime):
    """A .pte the runtime cannot read is refused with the runtime's own error, not a crash."""
    from edgeplug.examples import load_model

    model, args, *_ = load_model("mlp")
    result = edgeplug.lower(model, args, backend="vulkan")
    with pytest.raises(RuntimeRefusedError, match=r"ExecuTorch Vulkan runtime .* could not run the \.pte: "):
        runtime.run(result.buffer[:200], None, [list(args)])


def test_wrong_inputs_are_refused_by_the_runtime(runtime):
    from edgeplug.examples import load_model

    model, args, *_ = load_model("mlp")
    result = edgeplug.lower(model, args, backend="vulkan")
    with pytest.raises(RuntimeRefusedError, match="execute"):
        runtime.run(result.buffer, result.data_buffer, [[torch.zeros(3, 3, dtype=torch.int32)]])


# ---- everywhere, runtime or not ---------------------------------------------------------------

def test_a_runner_variable_that_names_no_file_falls_back_with_its_reason(monkeypatch, tmp_path):
    monkeypatch.setenv(RUNNER_VARIABLE, str(tmp_path / "nothing-here"))
    with pytest.raises(RuntimeNotFound, match=f"{RUNNER_VARIABLE}=.*is not an executable file"):
        device_runtime()
    from edgeplug.examples import load_model

    model, args, *_ = load_model("mlp")
    v = edgeplug.lower(model, args, backend="vulkan", verify=True).report.verification
    assert v.method == "kernels"
    assert "host emulation" in v.note and RUNNER_VARIABLE in v.note, v.note


def test_off_turns_the_runtime_off(monkeypatch):
    monkeypatch.setenv(RUNNER_VARIABLE, "off")
    with pytest.raises(RunnerNotFound, match="off"):
        find_runner()
    with pytest.raises(RuntimeNotFound, match="turns ExecuTorch's Vulkan runtime off"):
        device_runtime()


def test_backends_says_whether_the_runtime_is_found(monkeypatch, edgeplug_cli, tmp_path):
    monkeypatch.setenv(RUNNER_VARIABLE, str(tmp_path / "nothing-here"))
    code, out, err = edgeplug_cli("backends", "--no-adapter", "--no-probe")
    assert code == 0, err
    assert "vulkan runtime: none, --verify runs the host emulation" in out, out
    assert RUNNER_VARIABLE in out


def test_backends_names_the_runtime_it_found(runtime, edgeplug_cli):
    code, out, err = edgeplug_cli("backends", "--no-adapter", "--no-probe")
    assert code == 0, err
    assert f"vulkan runtime: {runtime.name} (--verify runs the .pte in it)" in out, out
