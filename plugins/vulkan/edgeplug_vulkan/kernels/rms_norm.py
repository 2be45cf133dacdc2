"""``et_vk.rms_norm`` for the Vulkan backend: a GLSL (``#version 450``) compute shader.

The same algorithm as the Vulkan runtime's buffer shader: one workgroup per
row, fp32 sums of squares per invocation, a tree reduction in shared memory,
then each invocation writes its slice. Unlike glslang, wgpu's GLSL frontend
compiles ``barrier()`` to a subgroup-scope barrier, so the workgroup here is
one subgroup (32 invocations on NVIDIA; probed per adapter). It runs through wgpu (naga translates
the GLSL) on the Vulkan adapter. Variants are chosen by preprocessor defines:
``WG_SIZE`` (a power of two) and ``LANES`` (4: vec4 path for widths that are a
multiple of 4; 1: scalar path). Storage is fp32, as in the Vulkan runtime's
buffer path.

Before dispatch, host verification checks the Vulkan runtime's contract: the
weight is prepacked, so it must be a program constant; a weight computed at
run time is refused with the node named, where the real runtime would abort.

Needs torch, numpy and wgpu only.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from edgeplug.errors import KernelError
from edgeplug.runtime import rms_norm as contract
from edgeplug.runtime.device import GpuDevice, get_device

BACKEND = "vulkan"
OP = contract.OP
WHERE = f"{BACKEND} {OP}"

_SOURCE = """#version 450
#define WG_SIZE {wg}
#define LANES {lanes}

layout(local_size_x = WG_SIZE, local_size_y = 1, local_size_z = 1) in;

#if LANES == 4
#define T vec4
#define SUM_SQ(v) dot(v, v)
#else
#define T float
#define SUM_SQ(v) ((v) * (v))
#endif

layout(std430, set = 0, binding = 0) readonly buffer XBuffer {{ T x[]; }};
layout(std430, set = 0, binding = 1) readonly buffer WBuffer {{ T w[]; }};
layout(std430, set = 0, binding = 2) buffer YBuffer {{ T y[]; }};
layout(std140, set = 0, binding = 3) uniform Params {{
    uint rows;
    uint width;
    float n;
    float eps;
}} p;

shared float partial[WG_SIZE];

void main() {{
    // rows past the per-dimension dispatch limit arrive in gl_WorkGroupID.y
    uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (row >= p.rows) {{
        return;
    }}
    uint lid = gl_LocalInvocationID.x;
    uint base = row * p.width;
    float acc = 0.0;
    for (uint i = lid; i < p.width; i += uint(WG_SIZE)) {{
        T v = x[base + i];
        acc += SUM_SQ(v);
    }}
    partial[lid] = acc;
    // naga's barrier() is a workgroup barrier with shared-memory semantics
    // (it knows no memoryBarrierShared)
    barrier();
    for (uint s = uint(WG_SIZE) / 2u; s > 0u; s = s / 2u) {{
        if (lid < s) {{
            partial[lid] += partial[lid + s];
        }}
        barrier();
    }}
    float scale = inversesqrt(partial[0] / p.n + p.eps);
    for (uint i = lid; i < p.width; i += uint(WG_SIZE)) {{
        y[base + i] = x[base + i] * scale * w[i];
    }}
}}
"""


def glsl_source(lanes: int, workgroup_size: int) -> str:
    """The GLSL for one lane count (1 or 4) and workgroup size."""
    if lanes not in (1, 4):
        raise ValueError(f"lanes must be 1 or 4, got {lanes}")
    return _SOURCE.format(wg=int(workgroup_size), lanes=int(lanes))


def _subgroup_limit(device: GpuDevice) -> int:
    # wgpu's GLSL frontend (naga) turns barrier() into a barrier of subgroup
    # scope, which needs these features and synchronises one subgroup only: the
    # workgroup must therefore be one subgroup. Seen on an H200: 256 invocations
    # per workgroup gave wrong sums, 32 (one warp) correct ones.
    missing = {"subgroup", "subgroup-barrier"} - set(device.enabled)
    if missing:
        raise KernelError(
            f"{WHERE}: wgpu translates GLSL's barrier() into a barrier that needs the adapter features "
            f"{', '.join(sorted(missing))}, which {device.summary} lacks; choose another adapter with "
            "EDGEPLUG_WGPU_ADAPTER or use the webgpu kernel"
        )
    return int(device.subgroup_size)


_LIMIT_REASON = (
    "wgpu compiles GLSL's barrier() to a subgroup-scope barrier, so this kernel's workgroup must be "
    "one subgroup of the adapter"
)


def _pipeline(device: GpuDevice, dtype: torch.dtype, lanes: int, workgroup_size: int) -> Any:
    return device.pipeline(glsl_source(lanes, workgroup_size), label=f"{BACKEND} rms_norm x{lanes} wg{workgroup_size}")


def prepare(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: Optional[float] = None,
    *,
    device: Optional[GpuDevice] = None,
    workgroup_size: Optional[int] = None,
    cache_keys: Optional[Mapping[int, str]] = None,
) -> contract.PreparedRmsNorm:
    """Check, upload and bind; ``.run()`` dispatches and ``.result()`` reads y (benchmarks time ``run``)."""
    device = device or get_device()
    args = contract.check_args(x, weight, eps, where=WHERE, dtypes=(torch.float32,), dtype_hint=" (the Vulkan buffer shader's storage)")
    return contract.prepare(
        args, device, _pipeline, where=WHERE, workgroup_size=workgroup_size, cache_keys=cache_keys,
        workgroup_limit=_subgroup_limit(device), workgroup_limit_reason=_LIMIT_REASON,
    )


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: Optional[float] = None,
    *,
    device: Optional[GpuDevice] = None,
    workgroup_size: Optional[int] = None,
    cache_keys: Optional[Mapping[int, str]] = None,
) -> torch.Tensor:
    """``et_vk.rms_norm(x, weight, eps)`` through the GLSL shader; returns a CPU tensor.

    eps None means float32 machine epsilon. Raises ``edgeplug.errors.KernelError``
    before dispatch on a bad shape, dtype, weight length, eps or workgroup size.
    """
    prepared = prepare(x, weight, eps, device=device, workgroup_size=workgroup_size, cache_keys=cache_keys)
    prepared.run()
    return prepared.result()


def check_call(call: Any) -> None:
    """Host verification's pre-dispatch check: the Vulkan runtime's contract for this node.

    ``call`` is an ``edgeplug.runtime.OpCall``. The weight (argument 1) must be a
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
    contract.check_args(x, weight, eps, where=at, dtypes=(torch.float32,), dtype_hint=" (the Vulkan buffer shader's storage)")
