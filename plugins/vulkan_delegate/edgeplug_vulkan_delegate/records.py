"""The records every backend on executorch's Vulkan delegate shares (vulkan, webgpu, a third party's).

What a backend serialized by the Vulkan delegate gets from the delegate
itself, not from its own choices: the backend spec (the delegate's id, host
verification with kernels, the support check, the preprocess constant rules,
the lowering scope of ``_executorch``), the ops the delegate keeps whole and the
weight-only quantization schemes of ``VulkanQuantizer``. A plugin's hooks.py
yields these with its backend name, with ``fusion.rms_norm_policy`` and
``rewrites.canonical_rewrites``, and adds what is its own (partitioner,
description, kernels, whether its kernel accumulates in fp32).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Iterator, Optional

from edgeplug.plugin import BackendSpec, KeepWhole, QuantScheme

from edgeplug_vulkan_delegate._executorch import lowering_context
from edgeplug_vulkan_delegate.support import support_check

#: the delegate's serialized id (WebGPUPartitioner tags partitions for it too)
BACKEND_ID = "VulkanBackend"


def delegate_constants(original: Any, named: Any) -> Any:
    """The constants as the delegate's preprocess stores them (``BackendSpec.delegate_constants``)."""
    from edgeplug_vulkan_delegate.preprocess import VulkanConstants

    return VulkanConstants(original, named)


def backend_spec(
    backend: str, *, description: str, partitioner: Callable[[], Any], device_runtime: Optional[Callable[[], Any]] = None,
    availability: Optional[Callable[[], Any]] = None,
) -> BackendSpec:
    """A backend serialized by the Vulkan delegate, verified on the host with its kernels, or in its own
    runtime where ``device_runtime`` finds one (``edgeplug_vulkan_delegate.runtime.device_runtime``:
    ExecuTorch's Vulkan runtime built from source)."""
    extra: dict[str, Any] = {"availability": availability} if availability is not None else {}
    return BackendSpec(
        **extra,
        device_runtime=device_runtime,
        # ExecuTorch's Vulkan runtime (cff6f4d) does not keep a buffer moved into its delegate: the graph
        # declares the buffer's new value as an output the delegate call does not pass ("Vulkan graph
        # declares 1 inputs and 2 outputs, but the delegate call supplied 2 arguments"), stock's .pte
        # alike; its WebGPU runtime reads past the call's arguments and crashes (SIGSEGV); so a KV cache
        # stays a program input, its new value an output written back
        delegate_buffers=device_runtime is None,
        # ... and builds an embedding's, a convolution's or a norm's weight from constant data only: a weight
        # two partitions share (a tied embedding and lm_head) would reach one as an input and the program
        # would not load ("prepack_standard ... val_is_tref"); each partition gets its own copy (the
        # delegate keys constant data by content, so the .pte holds it once)
        copy_shared_constants=device_runtime is not None,
        backend=backend,
        description=description,
        backend_id=BACKEND_ID,
        partitioner=partitioner,
        verify_method="kernels",
        lowering_context=lowering_context,
        support_check=support_check,
        delegate_constants=delegate_constants,
        external_weights=True,  # vulkan_preprocess stores every constant in named data
    )


def keep_whole(backend: str) -> KeepWhole:
    """Ops the Vulkan delegate has whole-op shaders for."""
    import torch

    aten = torch.ops.aten
    return KeepWhole(backend=backend, ops=(aten.hardswish.default, aten.upsample_nearest2d.vec, aten.pixel_shuffle.default))


def _weight_only(bits: int) -> Any:
    from executorch.backends.vulkan.quantizer.vulkan_quantizer import VulkanQuantizer, get_symmetric_quantization_config

    return VulkanQuantizer().set_global(get_symmetric_quantization_config(weight_bits=bits))


def weight_only_schemes(backend: str) -> Iterator[QuantScheme]:
    """Weight-only linear schemes: executorch's VulkanQuantizer (8 and 4 bits per channel), torchao's int4 in groups."""
    for bits in (8, 4):
        yield QuantScheme(
            backend=backend, scheme=f"w{bits}", factory=partial(_weight_only, bits),
            activation_bits=None, weight_bits=bits, per_channel=True,
            description=f"weight-only: {bits}-bit per-channel linear weights, float activations (VulkanQuantizer)",
        )
    # torchao's grouped int4 weight-only linear, which the delegate packs into its own linear_q4gsw
    # (executorch's vulkan quantized_linear pattern). Its 8da4w form (linear_dq8ca_q4gsw) is not
    # offered: the delegate's pattern fails on a transformers Llama's attention output (a 4-d permute)
    yield QuantScheme(
        backend=backend, scheme="w4-g32", kind="source_transform", factory=partial(_torchao_int4_weights, 32),
        activation_bits=None, weight_bits=4, per_channel=False,
        description="weight-only: int4 symmetric linear weights in groups of 32, float activations "
        "(torchao IntxWeightOnlyConfig; the delegate's linear_q4gsw)",
    )


def _torchao_int4_weights(group_size: int) -> Any:
    import torch
    from torchao.quantization import IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerGroup

    return IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(group_size))
