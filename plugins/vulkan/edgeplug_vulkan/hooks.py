"""Hook implementations of the Vulkan backend (hookimpls only).

What every backend on the Vulkan delegate shares is in ``edgeplug_vulkan_delegate`` (a distribution of its own).
"""

from __future__ import annotations

from edgeplug.plugin import Kernel, PartitionerFilter, hookimpl

from edgeplug_vulkan_delegate import filters, fusion, records, rewrites
from edgeplug_vulkan_delegate.runtime import device_runtime

BACKEND = "vulkan"


def _partitioner():
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    return VulkanPartitioner()


@hookimpl
def edgeplug_backends():
    yield records.backend_spec(
        BACKEND, description="ExecuTorch Vulkan delegate (GPU compute through Vulkan)", partitioner=_partitioner,
        device_runtime=device_runtime,  # ExecuTorch's own Vulkan runtime, where it is built here
    )


@hookimpl
def edgeplug_partitioner_filters():
    # ExecuTorch's Vulkan runtime passes an activation's quantize/dequantize through unchanged
    yield PartitionerFilter(backend=BACKEND, name=filters.NAME, fn=filters.activation_fake_quant)
    # ... and cannot load a delegate in which an op computes a 0-d tensor
    yield PartitionerFilter(backend=BACKEND, name=filters.ZERO_DIM_NAME, fn=filters.zero_dim_results)
    # ... and has no kernel for ops its partitioner takes
    yield PartitionerFilter(backend=BACKEND, name=filters.RUNTIME_GAPS_NAME, fn=filters.runtime_gaps)


@hookimpl
def edgeplug_keep_whole():
    yield records.keep_whole(BACKEND)


@hookimpl
def edgeplug_passes():
    yield from rewrites.canonical_rewrites(BACKEND)


@hookimpl
def edgeplug_fusion_policies():
    yield fusion.rms_norm_policy(BACKEND, fp32_accumulation=False)


@hookimpl
def edgeplug_kernels():
    # GLSL (#version 450) compiled to SPIR-V, run through wgpu; needs torch, numpy and wgpu only
    from edgeplug_vulkan.kernels import check_rms_norm, rms_norm

    yield Kernel(backend=BACKEND, op="et_vk.rms_norm.default", impl=rms_norm, device="wgpu", checks=check_rms_norm)


@hookimpl
def edgeplug_quantizers():
    yield from records.weight_only_schemes(BACKEND)
