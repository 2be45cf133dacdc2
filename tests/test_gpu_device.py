"""edgeplug._runtime: adapter choice, the device's caches, kernel registration, no executorch needed."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import pytest
import torch

import edgeplug
from edgeplug._errors import KernelError
from edgeplug._runtime import ADAPTER_ENV, NoAdapterError, adapter_summary, get_device, reset_device
from edgeplug._runtime.device import AdapterInfo, choose_adapter

OP = "et_vk.rms_norm.default"

LLVMPIPE = AdapterInfo("llvmpipe (LLVM 15) (CPU) via Vulkan", "CPU", "Vulkan")
LLVMPIPE_GL = AdapterInfo("llvmpipe (LLVM 15) (CPU) via OpenGL", "CPU", "OpenGL")
NVIDIA = AdapterInfo("NVIDIA H200 (DiscreteGPU) via Vulkan", "DiscreteGPU", "Vulkan")
INTEL = AdapterInfo("Intel(R) UHD (IntegratedGPU) via Vulkan", "IntegratedGPU", "Vulkan")


def test_choose_prefers_hardware_then_vulkan():
    assert choose_adapter([LLVMPIPE_GL, LLVMPIPE, INTEL, NVIDIA], None) == 3
    assert choose_adapter([LLVMPIPE_GL, LLVMPIPE, INTEL], "") == 2
    assert choose_adapter([LLVMPIPE_GL, LLVMPIPE], None) == 1  # llvmpipe through Vulkan, not OpenGL


def test_environment_variable_picks_by_substring():
    assert choose_adapter([LLVMPIPE, NVIDIA], "LLVMpipe") == 0
    assert choose_adapter([LLVMPIPE, LLVMPIPE_GL], "opengl") == 1


def test_environment_variable_without_a_match_lists_the_adapters():
    with pytest.raises(NoAdapterError) as info:
        choose_adapter([LLVMPIPE, NVIDIA], "radeon")
    text = str(info.value)
    assert f"{ADAPTER_ENV}='radeon'" in text and "llvmpipe" in text and "NVIDIA H200" in text


def test_no_adapter_says_what_to_install():
    with pytest.raises(NoAdapterError, match="mesa-vulkan-drivers"):
        choose_adapter([], None)


@pytest.fixture
def no_adapter(monkeypatch):
    monkeypatch.setenv(ADAPTER_ENV, "none")
    reset_device()
    yield
    monkeypatch.undo()
    reset_device()


def test_disabled_adapter_fails_kernels_with_a_clear_message(no_adapter):
    from edgeplug_webgpu.kernels import rms_norm

    with pytest.raises(NoAdapterError, match=f"disabled by {ADAPTER_ENV}=none"):
        adapter_summary()
    with pytest.raises(KernelError, match="disabled"):  # NoAdapterError is a KernelError
        rms_norm(torch.ones(2, 4), torch.ones(4))


def test_cli_names_the_adapter(cli):
    code, out, _ = cli("backends", "--adapter")
    assert code == 0
    assert f"wgpu adapter: {get_device().summary}" in out
    assert "max storage binding" in out


def test_cli_says_why_there_is_no_adapter(cli, no_adapter):
    code, out, _ = cli("backends", "--adapter")
    assert code == 0 and "wgpu adapter: none" in out and f"{ADAPTER_ENV}=none" in out


def test_device_has_the_adapters_full_limits():
    dev = get_device()
    assert dev.limits["max-storage-buffer-binding-size"] == dev.adapter.limits["max-storage-buffer-binding-size"]
    assert get_device() is dev  # cached


def test_grid_spreads_rows_over_two_dimensions():
    dev = get_device()
    limit = dev.max_groups_per_dim
    assert dev.grid(limit) == (limit, 1, 1)
    gx, gy, _ = dev.grid(limit + 1)
    assert gy == 2 and gx * gy >= limit + 1 and gx <= limit
    with pytest.raises(KernelError, match="exceed what a 2-D dispatch reaches"):
        dev.grid(limit * limit + 1)


#: a shader with a pipeline-overridable constant, independent of any plugin's kernel source
_OVERRIDABLE = "override WG: u32 = 64;\n@compute @workgroup_size(WG) fn main() {}\n"


def test_pipelines_are_cached_and_constants_uploaded_once():
    dev = get_device()
    src = _OVERRIDABLE
    assert dev.pipeline(src, label="t", constants={"WG": 64}) is dev.pipeline(src, label="t", constants={"WG": 64})
    assert dev.pipeline(src, label="t", constants={"WG": 64}) is not dev.pipeline(src, label="t", constants={"WG": 32})
    w = torch.arange(8, dtype=torch.float32)
    buf = dev.constant("test-runtime-w8", w)
    assert dev.constant("test-runtime-w8", w) is buf
    torch.testing.assert_close(dev.read(buf, (8,), torch.float32), w)
    with pytest.raises(KernelError, match="uploaded with 32 bytes, now given 16"):
        dev.constant("test-runtime-w8", w[:4])


def test_a_shader_that_does_not_compile_is_named():
    with pytest.raises(KernelError, match=r"shader 'broken' (\(wgsl\) )?did not compile on"):
        get_device().pipeline("@compute @workgroup_size(1) fn main() { let x: f32 = 1u; }", label="broken")


@pytest.mark.parametrize("backend", ["webgpu", "vulkan"])
def test_kernels_are_registered_through_the_hook(backend):
    b = edgeplug.get_backend(backend)
    k = b.kernel(OP)
    assert k is not None and k.device == "wgpu" and k.checks is not None
    own = importlib.import_module(f"edgeplug_{backend}.kernels.rms_norm")
    assert k.impl == own.rms_norm and k.impl.__self__.pipeline is own.pipeline  # the plugin's own shader
    assert b.origin(k).distribution == f"edgeplug-{backend}"
    y = k.impl(torch.ones(2, 4), torch.full((4,), 2.0), 0.0)
    torch.testing.assert_close(y, torch.full((2, 4), 2.0))


def test_kernels_run_without_executorch():
    # the benchmark runs where executorch is absent: block it and use both kernels
    code = textwrap.dedent(
        """
        import sys
        sys.modules["executorch"] = None  # any import of executorch now fails
        import torch, torch.nn.functional as F
        from edgeplug_webgpu.kernels import rms_norm as wgsl
        from edgeplug_vulkan.kernels import rms_norm as glsl
        x, w = torch.randn(3, 8), torch.randn(8)
        for f in (wgsl, glsl):
            torch.testing.assert_close(f(x, w, 1e-6), F.rms_norm(x, (8,), w, 1e-6))
        assert not any(m.startswith("executorch.") for m in sys.modules)
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")


def test_an_explicit_workgroup_shape_is_kept_and_a_bad_one_refused():
    from edgeplug._runtime.rms_norm import choose_shape

    dev = get_device()
    shape = choose_shape(dev, 16, where="t", workgroup_size=32)
    assert (shape.invocations, shape.row_invocations, shape.rows) == (32, 32, 1)  # workgroup_size alone: one row each
    with pytest.raises(KernelError, match="t: workgroup_size must be a power of two >= 1, got 48"):
        choose_shape(dev, 16, where="t", workgroup_size=48)
    with pytest.raises(KernelError, match=r"t: workgroup_size \d+ exceeds what .* allows"):
        choose_shape(dev, 16, where="t", workgroup_size=1 << 20)
    with pytest.raises(KernelError, match="t: rows_per_workgroup 64 exceeds workgroup_size 32"):
        choose_shape(dev, 16, where="t", workgroup_size=32, rows_per_workgroup=64)
