"""The WebGPU plugin's WGSL et_vk.rms_norm on the wgpu adapter (llvmpipe in CI).

Behaviour is the shared suite's (``edgeplug_vulkan_delegate.testing``); below it, what
is this plugin's own: WGSL source variants and workgroup shapes.
"""

from __future__ import annotations

import pytest
import torch

from edgeplug.plugin import KernelError
from edgeplug.plugin import gpu_device
from edgeplug_vulkan_delegate.testing import RmsNormKernelSuite, rms_norm_reference
from edgeplug_webgpu.kernels import prepare_rms_norm, rms_norm, wgsl_source


class TestWebGpuRmsNorm(RmsNormKernelSuite):
    backend = "webgpu"
    dtypes = (torch.float32, torch.float16)


@pytest.fixture(scope="module")
def device():
    return gpu_device()


def _inputs(rows, width):
    g = torch.Generator().manual_seed(0)
    return torch.randn(rows, width, generator=g) * 3, 1 + 0.5 * torch.randn(width, generator=g)


@pytest.mark.parametrize("wg", [1, 2, 32, 256])
def test_workgroup_size_asked_for_is_the_one_dispatched(device, wg):
    if wg > device.max_workgroup_size:
        pytest.skip(f"{device.summary} allows {device.max_workgroup_size} invocations")
    x, w = _inputs(3, 260)  # 65 vec4 per row: more than some sizes, fewer than others
    prepared = prepare_rms_norm(x, w, 1e-6, workgroup_size=wg)
    assert prepared.workgroup_size == wg and prepared.layout.invocations == wg
    prepared.run()
    torch.testing.assert_close(prepared.result(), rms_norm_reference(x, w, 1e-6), rtol=1e-5, atol=1e-5)


def test_a_workgroup_size_that_is_no_power_of_two_is_refused():
    x, w = _inputs(2, 4)
    with pytest.raises(KernelError, match=r"webgpu et_vk.rms_norm.default: workgroup_size must be a power of two"):
        rms_norm(x, w, 1e-6, workgroup_size=48)


def test_wgsl_source_per_storage_dtype():
    fp32, fp16 = wgsl_source(torch.float32), wgsl_source(torch.float16)
    assert "@compute" in fp32 and "@compute" in fp16
    assert fp32 != fp16
