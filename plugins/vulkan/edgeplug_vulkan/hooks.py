"""Hook implementations of the Vulkan backend (hookimpls only).

What every backend on the Vulkan delegate shares is in ``edgeplug_vulkan_delegate`` (a distribution of its own).
"""

from __future__ import annotations

import edgeplug
from edgeplug.plugin import Kernel

from edgeplug_vulkan_delegate import fusion, records, rewrites
from edgeplug_vulkan_delegate.runtime import device_runtime

BACKEND = "vulkan"


def _partitioner():
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    return VulkanPartitioner()


@edgeplug.hookimpl
def edgeplug_backends():
    yield records.backend_spec(
        BACKEND, description="ExecuTorch Vulkan delegate (GPU compute through Vulkan)", partitioner=_partitioner,
        device_runtime=device_runtime,  # ExecuTorch's own Vulkan runtime, where it is built here
    )


@edgeplug.hookimpl
def edgeplug_keep_whole():
    yield records.keep_whole(BACKEND)


@edgeplug.hookimpl
def edgeplug_passes():
    yield from rewrites.canonical_rewrites(BACKEND)


@edgeplug.hookimpl
def edgeplug_fusion_policies():
    yield fusion.rms_norm_policy(BACKEND, fp32_accumulation=False)


@edgeplug.hookimpl
def edgeplug_kernels():
    # GLSL (#version 450) compiled to SPIR-V, run through wgpu; needs torch, numpy and wgpu only
    from edgeplug_vulkan.kernels import check_rms_norm, rms_norm

    yield Kernel(backend=BACKEND, op="et_vk.rms_norm.default", impl=rms_norm, device="wgpu", checks=check_rms_norm)


@edgeplug.hookimpl
def edgeplug_quantizers():
    yield from records.weight_only_schemes(BACKEND)
