"""edgeplug._runtime.device: adapter choice, the device's caches, the façade's one device; no executorch, no backend."""

from __future__ import annotations

import pytest
import torch

from edgeplug._errors import KernelError
from edgeplug._runtime.device import ADAPTER_ENV, DeviceCache, NoAdapterError, open_device
from edgeplug._runtime.device import AdapterInfo, choose_adapter
from edgeplug.plugin import gpu_device

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
    yield
    monkeypatch.undo()


def test_disabled_adapter_fails_with_a_clear_message(no_adapter):
    with pytest.raises(NoAdapterError, match=f"disabled by {ADAPTER_ENV}=none"):
        gpu_device()
    with pytest.raises(KernelError, match="disabled"):  # NoAdapterError is a KernelError
        open_device()


def test_the_facade_keeps_one_device_per_adapter_choice(monkeypatch):
    dev = gpu_device()
    assert gpu_device() is dev  # cached at the façade
    monkeypatch.setenv(ADAPTER_ENV, dev.summary)  # the same adapter, another choice: its own device
    other = gpu_device()
    assert other is not dev and other.summary == dev.summary
    monkeypatch.setenv(ADAPTER_ENV, "none")
    with pytest.raises(NoAdapterError):
        gpu_device()
    monkeypatch.delenv(ADAPTER_ENV)
    assert gpu_device() is dev  # the variable unset again: the first device, not a stale failure


def test_open_device_keeps_nothing_and_a_cache_is_its_owners():
    a, b = open_device(), open_device()
    assert a is not b  # nothing module-level: each call opens its own
    cache = DeviceCache()
    assert cache.get() is cache.get() and cache.get() is not gpu_device()
    with pytest.raises(NoAdapterError, match="radeon"):
        cache.get("radeon")
    with pytest.raises(NoAdapterError, match="radeon"):  # the failure is kept, and raised again
        cache.get("radeon")
    first = cache.get()
    cache.clear()
    assert cache.get() is not first


def test_cli_names_the_adapter(cli):
    code, out, _ = cli("backends", "--adapter")
    assert code == 0
    assert f"wgpu adapter: {gpu_device().summary}" in out
    assert "max storage binding" in out


def test_cli_says_why_there_is_no_adapter(cli, no_adapter):
    code, out, _ = cli("backends", "--adapter")
    assert code == 0 and "wgpu adapter: none" in out and f"{ADAPTER_ENV}=none" in out


def test_device_has_the_adapters_full_limits():
    dev = gpu_device()
    assert dev.limits["max-storage-buffer-binding-size"] == dev.adapter.limits["max-storage-buffer-binding-size"]


def test_grid_spreads_rows_over_two_dimensions():
    dev = gpu_device()
    limit = dev.max_groups_per_dim
    assert dev.grid(limit) == (limit, 1, 1)
    gx, gy, _ = dev.grid(limit + 1)
    assert gy == 2 and gx * gy >= limit + 1 and gx <= limit
    with pytest.raises(KernelError, match="exceed what a 2-D dispatch reaches"):
        dev.grid(limit * limit + 1)


#: a shader with a pipeline-overridable constant, independent of any plugin's kernel source
_OVERRIDABLE = "override WG: u32 = 64;\n@compute @workgroup_size(WG) fn main() {}\n"


def test_pipelines_are_cached_and_constants_uploaded_once():
    dev = gpu_device()
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
        gpu_device().pipeline("@compute @workgroup_size(1) fn main() { let x: f32 = 1u; }", label="broken")
