"""Hook implementations of the Vulkan backend (hookimpls only)."""

from __future__ import annotations

import edgeplug
from edgeplug import BackendSpec, FusionPolicy, Kernel, KeepWhole

from edgeplug_vulkan.support import support_check as vulkan_support_check


def _partitioner():
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    return VulkanPartitioner()


def _lowering_context():
    # executorch's own Vulkan rms_norm pattern would fuse what the core refused
    from edgeplug.fusion import without_executorch_vulkan_pattern

    return without_executorch_vulkan_pattern("rms_norm")


@edgeplug.hookimpl
def edgeplug_backends():
    yield BackendSpec(
        backend="vulkan",
        description="ExecuTorch Vulkan delegate (GPU compute through Vulkan)",
        backend_id="VulkanBackend",
        partitioner=_partitioner,
        verify_method="kernels",
        lowering_context=_lowering_context,
        support_check=vulkan_support_check,
    )


@edgeplug.hookimpl
def edgeplug_keep_whole():
    import torch

    aten = torch.ops.aten
    # ops the Vulkan delegate has whole-op shaders for
    yield KeepWhole(
        backend="vulkan",
        ops=(aten.hardswish.default, aten.upsample_nearest2d.vec, aten.pixel_shuffle.default),
    )


@edgeplug.hookimpl
def edgeplug_fusion_policies():
    # The runtime prepacks the weight: only a leaf constant of shape [D] may
    # be the fused op's weight; computed constants are folded first; a runtime
    # scale stays a separate multiply after a unit-weight norm.
    yield FusionPolicy(
        backend="vulkan",
        pattern="rms_norm",
        target="et_vk.rms_norm",
        weight_sources=frozenset({"leaf"}),
        fold_computed_constants=True,
        unit_weight_fallback=True,
        fp32_accumulation=False,
    )


@edgeplug.hookimpl
def edgeplug_kernels():
    # GLSL (#version 450), run through wgpu; importing the kernels needs torch, numpy and wgpu only
    from edgeplug_vulkan.kernels import check_rms_norm, rms_norm

    yield Kernel(backend="vulkan", op="et_vk.rms_norm.default", impl=rms_norm, device="wgpu", checks=check_rms_norm)


def _weight_only(bits: int):
    from executorch.backends.vulkan.quantizer.vulkan_quantizer import VulkanQuantizer, get_symmetric_quantization_config

    return VulkanQuantizer().set_global(get_symmetric_quantization_config(weight_bits=bits))


@edgeplug.hookimpl
def edgeplug_quantizers():
    from functools import partial

    # executorch's VulkanQuantizer: weight-only, linear layers
    for bits in (8, 4):
        yield edgeplug.QuantScheme(
            backend="vulkan", scheme=f"w{bits}", factory=partial(_weight_only, bits),
            activation_bits=None, weight_bits=bits, per_channel=True,
            description=f"weight-only: {bits}-bit per-channel linear weights, float activations (VulkanQuantizer)",
        )
