"""``et_vk.rms_norm`` for the WebGPU backend: a WGSL compute shader.

The workgroup shape comes from ``edgeplug_vulkan_delegate.kernel_contract.choose_shape`` (the
Vulkan plugin's GLSL kernel uses the same): a workgroup normalises
``rows`` rows with ``row_invocations`` invocations each. Every invocation
loads up to ``items`` 16-byte units of its row into registers (consecutive
invocations read consecutive units, so loads coalesce; with few units, without
branches and together with the weight's: ``WorkgroupShape.straight_loads``),
sums their squares in fp32, the row's partial sums are added with ``subgroupShuffleXor`` where the
adapter has subgroups (plus one barrier when a row spans several subgroups)
or with a tree in workgroup memory where it has not, and each invocation
scales its registers and writes them. Storage is f32 (``vec4<f32>`` units) or
f16 packed two to a ``u32`` (``vec4<u32>`` units, ``unpack2x16float``), so
fp16 needs no adapter feature; sums are fp32 either way.

Needs torch, numpy and wgpu only.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from edgeplug.plugin import GpuDevice
from edgeplug_vulkan_delegate import kernel_contract as contract
from edgeplug_vulkan_delegate.kernel_contract import WorkgroupShape

BACKEND = "webgpu"
OP = contract.OP
WHERE = f"{BACKEND} {OP}"
DTYPES = (torch.float32, torch.float16)

_STORAGE = {
    torch.float32: """alias Unit = vec4<f32>;
fn sum_sq(u: Unit) -> f32 { return dot(u, u); }
fn scaled(u: Unit, g: Unit, s: f32) -> Unit { return u * s * g; }
""",
    # 8 halves in 4 words: unpack to fp32, compute, pack back
    torch.float16: """alias Unit = vec4<u32>;
fn sum_sq(u: Unit) -> f32 {
    let a = unpack2x16float(u.x);
    let b = unpack2x16float(u.y);
    let c = unpack2x16float(u.z);
    let d = unpack2x16float(u.w);
    return dot(a, a) + dot(b, b) + dot(c, c) + dot(d, d);
}
fn scaled(u: Unit, g: Unit, s: f32) -> Unit {
    return Unit(
        pack2x16float(unpack2x16float(u.x) * s * unpack2x16float(g.x)),
        pack2x16float(unpack2x16float(u.y) * s * unpack2x16float(g.y)),
        pack2x16float(unpack2x16float(u.z) * s * unpack2x16float(g.z)),
        pack2x16float(unpack2x16float(u.w) * s * unpack2x16float(g.w)),
    );
}
""",
}

_REDUCE = {
    # shuffles within a subgroup; a row wider than one subgroup adds its subgroups' sums in
    # workgroup memory (subgroups are runs of consecutive invocations; the tests check it)
    True: """    let span = min(T, sg);
    for (var off = 1u; off < span; off = off << 1u) {
        acc += subgroupShuffleXor(acc, off);
    }
    if (T > sg) {
        if (sl == 0u) {
            partial[lid / sg] = acc;
        }
        workgroupBarrier();
        let per = T / sg;
        let first = (lid / T) * per;
        acc = 0.0;
        for (var j = 0u; j < per; j++) {
            acc += partial[first + j];
        }
    }
""",
    False: """    partial[lid] = acc;
    workgroupBarrier();
    for (var s = T / 2u; s > 0u; s = s >> 1u) {
        if (t < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    acc = partial[lid - t];
""",
}

_BODY = """
struct Params {
    rows: u32,
    units: u32,
    n: f32,
    eps: f32,
}

@group(0) @binding(0) var<storage, read> x: array<Unit>;
@group(0) @binding(1) var<storage, read> w: array<Unit>;
@group(0) @binding(2) var<storage, read_write> y: array<Unit>;
@group(0) @binding(3) var<uniform> p: Params;

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    SUBGROUP_ARGS
) {
    // workgroups past the per-dimension dispatch limit arrive in wid.y
    let group = wid.x + wid.y * nwg.x;
    let t = lid % T;
    let row = group * (WG / T) + lid / T;
    // no early return: every invocation must reach the barriers
    let valid = row < p.rows;
    let base = row * p.units;
    let last = p.rows * p.units - 1u;  // x's last unit: where straight loads clamp to
    var acc = 0.0;
LOADS
    // the part of a row past the registers is read twice
    for (var i = t + ITEMS * T; valid && i < p.units; i += T) {
        acc += sum_sq(x[base + i]);
    }
REDUCE
    let scale = inverseSqrt(acc / p.n + p.eps);
    if (valid) {
STORES
        for (var i = t + ITEMS * T; i < p.units; i += T) {
            y[base + i] = scaled(x[base + i], w[i], scale);
        }
    }
}
"""


def _unrolled(items: int, straight: bool) -> tuple[str, str]:
    """The register-cached part, one named variable per unit (a local array would go to local memory).

    ``straight`` (``WorkgroupShape.straight_loads``): every load without a branch, the
    weight's with x's, addresses clamped into the buffers and units past the row zeroed.
    """
    loads, stores = [], []
    for k in range(items):
        if straight:
            loads.append(
                f"    let i{k} = t + {k}u * T;\n"
                f"    let v{k} = select(Unit(), x[min(base + i{k}, last)], valid && i{k} < p.units);\n"
                f"    let g{k} = w[min(i{k}, p.units - 1u)];\n"
                f"    acc += sum_sq(v{k});"
            )
            weight = f"g{k}"
        else:
            loads.append(
                f"    let i{k} = t + {k}u * T;\n"
                f"    var v{k} = Unit();\n"
                f"    if (valid && i{k} < p.units) {{\n        v{k} = x[base + i{k}];\n    }}\n"
                f"    acc += sum_sq(v{k});"
            )
            weight = f"w[i{k}]"
        stores.append(f"        if (i{k} < p.units) {{\n            y[base + i{k}] = scaled(v{k}, {weight}, scale);\n        }}")
    return "\n".join(loads), "\n".join(stores)


def wgsl_source(dtype: torch.dtype, shape: Optional[WorkgroupShape] = None) -> str:
    """The WGSL for one storage dtype (float32/float16) and workgroup shape (default: 256 invocations per row, 4 units each, subgroups)."""
    if dtype not in _STORAGE:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype}")
    shape = shape or WorkgroupShape(invocations=256, row_invocations=256, items=4, subgroups=True)
    consts = (
        f"const WG: u32 = {shape.invocations}u;\n"
        f"const T: u32 = {shape.row_invocations}u;\n"
        f"const ITEMS: u32 = {shape.items}u;\n"
    )
    args = "@builtin(subgroup_size) sg: u32,\n    @builtin(subgroup_invocation_id) sl: u32," if shape.subgroups else ""
    loads, stores = _unrolled(shape.items, shape.straight_loads)
    body = (
        _BODY.replace("SUBGROUP_ARGS", args).replace("REDUCE", _REDUCE[shape.subgroups].rstrip("\n"))
        .replace("LOADS", loads).replace("STORES", stores)
    )
    return consts + _STORAGE[dtype] + body


def pipeline(device: GpuDevice, dtype: torch.dtype, shape: WorkgroupShape) -> Any:
    """The compute pipeline for one storage dtype and workgroup shape (cached by the device)."""
    dt = str(dtype).replace("torch.", "")
    return device.pipeline(wgsl_source(dtype, shape), label=f"{BACKEND} rms_norm {dt} {shape.tag()}")


#: ``prepare(x, weight, eps, **options)`` and ``rms_norm(...)``: ``edgeplug_vulkan_delegate.kernel_contract.ShaderKernel``
KERNEL = contract.ShaderKernel(WHERE, DTYPES, pipeline)
prepare = KERNEL.prepare
rms_norm = KERNEL.rms_norm


def check_call(call: Any) -> None:
    """Host verification's pre-dispatch check: the op's arguments (any weight source is fine on WebGPU)."""
    x, weight, eps = (list(call.args) + [None, None, None])[:3]
    contract.check_args(x, weight, eps, where=f"{WHERE} at node {call.node!r}", dtypes=DTYPES)
