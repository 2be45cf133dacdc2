"""Hook implementations of the Vulkan backend (hookimpls only).

What every backend on the Vulkan delegate shares is in ``edgeplug_vulkan.delegate``.
"""

from __future__ import annotations

import edgeplug
from edgeplug.plugin import Kernel

from edgeplug_vulkan import delegate

BACKEND = "vulkan"


def _partitioner():
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    return VulkanPartitioner()


@edgeplug.hookimpl
def edgeplug_backends():
    yield delegate.backend_spec(
        BACKEND, description="ExecuTorch Vulkan delegate (GPU compute through Vulkan)", partitioner=_partitioner
    )


@edgeplug.hookimpl
def edgeplug_keep_whole():
    yield delegate.keep_whole(BACKEND)


@edgeplug.hookimpl
def edgeplug_passes():
    yield from delegate.canonical_rewrites(BACKEND)


@edgeplug.hookimpl
def edgeplug_fusion_policies():
    yield delegate.rms_norm_policy(BACKEND, fp32_accumulation=False)


@edgeplug.hookimpl
def edgeplug_kernels():
    # GLSL (#version 450) compiled to SPIR-V, run through wgpu; needs torch, numpy and wgpu only
    from edgeplug_vulkan.kernels import check_rms_norm, rms_norm

    yield Kernel(backend=BACKEND, op="et_vk.rms_norm.default", impl=rms_norm, device="wgpu", checks=check_rms_norm)


@edgeplug.hookimpl
def edgeplug_quantizers():
    yield from delegate.weight_only_schemes(BACKEND)
