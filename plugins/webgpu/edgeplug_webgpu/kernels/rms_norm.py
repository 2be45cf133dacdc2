"""``et_vk.rms_norm`` for the WebGPU backend: a WGSL compute shader.

One workgroup per row. Each invocation sums the squares of a strided slice of
the row in fp32, a tree reduction in workgroup memory adds the partial sums,
and every invocation then writes its slice scaled by ``rsqrt(mean + eps)`` and
the weight. The workgroup size is a pipeline-overridable constant (a power of
two); a row whose width is a multiple of 4 is read and written as vec4, any
other as scalars. Storage is f32, or f16 where the adapter has shader-f16
(accumulation stays f32).

Needs torch, numpy and wgpu only.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from edgeplug.runtime import rms_norm as contract
from edgeplug.runtime.device import GpuDevice, get_device

BACKEND = "webgpu"
OP = contract.OP
WHERE = f"{BACKEND} {OP}"

# The body is shared by the four variants; a header defines the storage type
# (Store), its fp32 counterpart (Acc) and the sum of squares of one Acc.
_BODY = """
struct Params {
    rows: u32,
    width: u32,
    n: f32,
    eps: f32,
}

@group(0) @binding(0) var<storage, read> x: array<Store>;
@group(0) @binding(1) var<storage, read> w: array<Store>;
@group(0) @binding(2) var<storage, read_write> y: array<Store>;
@group(0) @binding(3) var<uniform> p: Params;

override WG: u32 = 64u;
var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // rows past the per-dimension dispatch limit arrive in wid.y
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;  // uniform across the workgroup: row depends on workgroup ids only
    }
    let base = row * p.width;
    var acc = 0.0;
    for (var i = lid; i < p.width; i += WG) {
        acc += sum_sq(Acc(x[base + i]));
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    let scale = inverseSqrt(partial[0] / p.n + p.eps);
    for (var i = lid; i < p.width; i += WG) {
        y[base + i] = Store(Acc(x[base + i]) * scale * Acc(w[i]));
    }
}
"""

_HEADERS = {
    (torch.float32, 4): "alias Store = vec4<f32>;\nalias Acc = vec4<f32>;\nfn sum_sq(v: Acc) -> f32 { return dot(v, v); }\n",
    (torch.float32, 1): "alias Store = f32;\nalias Acc = f32;\nfn sum_sq(v: Acc) -> f32 { return v * v; }\n",
    (torch.float16, 4): "enable f16;\nalias Store = vec4<f16>;\nalias Acc = vec4<f32>;\nfn sum_sq(v: Acc) -> f32 { return dot(v, v); }\n",
    (torch.float16, 1): "enable f16;\nalias Store = f16;\nalias Acc = f32;\nfn sum_sq(v: Acc) -> f32 { return v * v; }\n",
}


def wgsl_source(dtype: torch.dtype, lanes: int) -> str:
    """The WGSL for one storage dtype (float32/float16) and lane count (1 or 4)."""
    return _HEADERS[(dtype, lanes)] + _BODY


def _pipeline(device: GpuDevice, dtype: torch.dtype, lanes: int, workgroup_size: int) -> Any:
    dt = str(dtype).replace("torch.", "")
    return device.pipeline(
        wgsl_source(dtype, lanes), label=f"{BACKEND} rms_norm {dt} x{lanes}", constants={"WG": workgroup_size}
    )


def _dtypes(device: GpuDevice) -> tuple[tuple[torch.dtype, ...], str]:
    if device.has_f16:
        return (torch.float32, torch.float16), ""
    return (torch.float32,), f" ({device.summary} has no shader-f16, so no float16)"


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
    dtypes, hint = _dtypes(device)
    args = contract.check_args(x, weight, eps, where=WHERE, dtypes=dtypes, dtype_hint=hint)
    return contract.prepare(args, device, _pipeline, where=WHERE, workgroup_size=workgroup_size, cache_keys=cache_keys)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: Optional[float] = None,
    *,
    device: Optional[GpuDevice] = None,
    workgroup_size: Optional[int] = None,
    cache_keys: Optional[Mapping[int, str]] = None,
) -> torch.Tensor:
    """``et_vk.rms_norm(x, weight, eps)`` on the wgpu adapter; returns a CPU tensor of x's shape and dtype.

    eps None means float32 machine epsilon. Raises ``edgeplug.errors.KernelError``
    before dispatch on a bad shape, dtype, weight length, eps or workgroup size.
    """
    prepared = prepare(x, weight, eps, device=device, workgroup_size=workgroup_size, cache_keys=cache_keys)
    prepared.run()
    return prepared.result()


def check_call(call: Any) -> None:
    """Host verification's pre-dispatch check: the op's arguments (any weight source is fine on WebGPU)."""
    x, weight, eps = (list(call.args) + [None, None, None])[:3]
    dtypes = (torch.float32, torch.float16)
    contract.check_args(x, weight, eps, where=f"{WHERE} at node {call.node!r}", dtypes=dtypes)
