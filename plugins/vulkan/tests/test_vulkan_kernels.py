"""The Vulkan plugin's GLSL et_vk.rms_norm (compiled to SPIR-V, run through wgpu; llvmpipe in CI).

Behaviour is the shared suite's (``edgeplug_vulkan_delegate.testing``); below it, what
is this plugin's own: the GLSL source, workgroup shapes, and the Vulkan
runtime's rule that the weight is a prepacked constant.
"""

from __future__ import annotations

import pytest
import torch

from edgeplug.plugin import KernelError
from edgeplug.plugin import gpu_device
from edgeplug_vulkan_delegate.testing import RmsNormKernelSuite, rms_norm_reference
from edgeplug_vulkan.kernels import check_rms_norm, glsl_source, prepare_rms_norm


class TestVulkanRmsNorm(RmsNormKernelSuite):
    backend = "vulkan"
    dtypes = (torch.float32, torch.float16)


@pytest.fixture(scope="module")
def device():
    return gpu_device()


def _inputs(rows, width):
    g = torch.Generator().manual_seed(0)
    return torch.randn(rows, width, generator=g) * 3, 1 + 0.5 * torch.randn(width, generator=g)


@pytest.mark.parametrize("wg", [1, 2, 32])
def test_workgroup_size_asked_for_is_the_one_dispatched(device, wg):
    x, w = _inputs(3, 260)
    prepared = prepare_rms_norm(x, w, 1e-6, workgroup_size=wg)
    assert prepared.workgroup_size == wg and prepared.layout.invocations == wg
    prepared.run()
    torch.testing.assert_close(prepared.result(), rms_norm_reference(x, w, 1e-6), rtol=1e-5, atol=1e-5)


def test_glsl_450_source():
    src = glsl_source(torch.float32)
    assert src.startswith("#version 450")
    assert "@compute" not in src  # wgpu would take it for WGSL


def test_runtime_weight_is_refused_naming_the_node():
    from edgeplug.plugin import OpCall

    call = OpCall(
        backend="vulkan", op="et_vk.rms_norm.default", node="et_vk_rms_norm_default",
        args=(torch.ones(2, 4), torch.ones(4), 1e-6), delegate="lowered_module_0", constants={}, sources={0: "x", 1: "mul_3"},
    )
    with pytest.raises(KernelError) as info:
        check_rms_norm(call)
    text = str(info.value)
    assert "'et_vk_rms_norm_default'" in text and "'lowered_module_0'" in text
    assert "'mul_3', which is not a constant" in text and "prepacks" in text
    ok = OpCall(**{**call.__dict__, "constants": {1: "blocks.0.attn_norm.weight"}})
    check_rms_norm(ok)  # a constant weight passes
