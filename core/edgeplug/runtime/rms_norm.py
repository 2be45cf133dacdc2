"""The ``et_vk.rms_norm`` contract the GPU plugins' kernels share.

``y = x * rsqrt(mean(x**2, -1) + eps) * weight`` over the last dimension,
accumulated in fp32 whatever the storage dtype. The plugins own the shaders
(WGSL for WebGPU, GLSL for Vulkan); this module owns what both must agree on:
argument checks that fail before dispatch, the parameter block the shaders
read, the workgroup size, and the one-workgroup-per-row launch (rows past
the adapter's per-dimension limit go to the y dimension).

Parameter block (16 bytes, same layout for WGSL and GLSL std140)::

    rows: u32    rows to normalise
    width: u32   row length in storage units (elements / lanes)
    n: f32       row length in elements (the mean's divisor)
    eps: f32
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional

import torch

from edgeplug.errors import KernelError
from edgeplug.runtime.device import GpuDevice

OP = "et_vk.rms_norm.default"
#: the eps the op takes when the graph gives none (float32 machine epsilon)
DEFAULT_EPS = float(torch.finfo(torch.float32).eps)
#: default workgroup: the power of two covering a row, at most 256 invocations, and 512 for
#: rows of 8192 elements or more (on an H200: 512 moved 3741 GB/s at 32768x8192 where 256
#: moved 2934; at 65536x4096 and 16384x5000, 256 was best)
DEFAULT_MAX_WORKGROUP = 256
WIDE_ROW_ELEMENTS, WIDE_ROW_WORKGROUP = 8192, 512

#: builds (or fetches from the device's cache) the pipeline for (dtype, lanes, workgroup size)
PipelineFactory = Callable[[GpuDevice, torch.dtype, int, int], Any]


@dataclass(frozen=True)
class RmsNormArgs:
    """Checked arguments: contiguous host tensors and the resolved eps."""

    x: torch.Tensor
    weight: torch.Tensor
    eps: float
    rows: int
    width: int

    @property
    def lanes(self) -> int:
        """4 (the vec4 path) when the row width is a multiple of 4, else 1 (the scalar path)."""
        return 4 if self.width % 4 == 0 else 1


def check_args(
    x: Any,
    weight: Any,
    eps: Any,
    *,
    where: str,
    dtypes: Iterable[torch.dtype],
    dtype_hint: str = "",
) -> RmsNormArgs:
    """Validate rms_norm's arguments; raise KernelError naming ``where`` (backend and op) and the value."""
    allowed = tuple(dtypes)
    if not isinstance(x, torch.Tensor):
        raise KernelError(f"{where}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1:
        raise KernelError(f"{where}: x is a 0-d tensor; rms_norm normalises the last dimension, so x needs at least 1")
    width = int(x.shape[-1])
    if width < 1:
        raise KernelError(f"{where}: x has shape {tuple(x.shape)}: the normalised (last) dimension is empty")
    if x.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise KernelError(f"{where}: x has dtype {str(x.dtype).replace('torch.', '')}; this kernel stores {names}{dtype_hint}. Cast x first")
    if weight is None:
        raise KernelError(f"{where}: weight is None; et_vk.rms_norm takes a weight of shape [{width}] (pass torch.ones({width}) for none)")
    if not isinstance(weight, torch.Tensor):
        raise KernelError(f"{where}: weight must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != 1 or int(weight.shape[0]) != width:
        raise KernelError(
            f"{where}: weight has shape {tuple(weight.shape)}, but x's last dimension is {width}; "
            f"the weight must have shape ({width},)"
        )
    if weight.dtype != x.dtype:
        raise KernelError(
            f"{where}: weight has dtype {str(weight.dtype).replace('torch.', '')} but x has "
            f"{str(x.dtype).replace('torch.', '')}; cast the weight to x's dtype"
        )
    if eps is None:
        eps = DEFAULT_EPS
    if isinstance(eps, torch.Tensor) and eps.numel() == 1:
        eps = eps.item()
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise KernelError(f"{where}: eps must be a number, got {type(eps).__name__} {eps!r}")
    eps = float(eps)
    if not math.isfinite(eps) or eps < 0:
        raise KernelError(f"{where}: eps is {eps!r}; it must be finite and >= 0")
    xc = x.detach().to("cpu").contiguous()
    rows = xc.numel() // width
    return RmsNormArgs(x=xc, weight=weight.detach().to("cpu").contiguous(), eps=eps, rows=rows, width=width)


def choose_workgroup_size(
    device: GpuDevice,
    units_per_row: int,
    requested: Optional[int],
    *,
    where: str,
    row_elements: Optional[int] = None,
    limit: Optional[int] = None,
    limit_reason: str = "",
) -> int:
    """The workgroup size: ``requested`` if valid, else the default above (within the adapter's limits).

    ``limit`` is a kernel's own ceiling (e.g. one subgroup), explained by ``limit_reason``.
    """
    cap = min(device.max_workgroup_size, int(device.limits.get("max-compute-workgroup-storage-size", 16384)) // 4)
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1 or requested & (requested - 1):
            raise KernelError(f"{where}: workgroup_size must be a power of two >= 1, got {requested!r}")
        if requested > cap:
            raise KernelError(f"{where}: workgroup_size {requested} exceeds what {device.summary} allows ({cap})")
        if limit is not None and requested > limit:
            raise KernelError(f"{where}: workgroup_size {requested} exceeds {limit}: {limit_reason}")
        return requested
    if limit is not None:
        cap = min(cap, limit)
    if device.adapter_type == "CPU" and device.subgroup_size:
        # a CPU adapter (llvmpipe) runs a subgroup as one SIMD loop: wider groups only add
        # barrier cost (measured on llvmpipe at 4096x5000: 8 invocations 2.6 GB/s, 256 1.1 GB/s)
        cap = min(cap, device.subgroup_size)
    elements = units_per_row if row_elements is None else row_elements
    most = WIDE_ROW_WORKGROUP if elements >= WIDE_ROW_ELEMENTS else DEFAULT_MAX_WORKGROUP
    wg = 1
    while wg < units_per_row and wg < most:
        wg *= 2
    while wg > cap:
        wg //= 2
    return wg


class PreparedRmsNorm:
    """Buffers bound and pipeline built: ``run()`` dispatches, ``result()`` reads y back."""

    def __init__(self, device: GpuDevice, pipeline: Any, bind_group: Any, grid: tuple[int, int, int], out: Any, shape: tuple, dtype: torch.dtype, workgroup_size: int) -> None:
        self.device = device
        self.pipeline = pipeline
        self.bind_group = bind_group
        self.grid = grid
        self.out = out
        self.shape = shape
        self.dtype = dtype
        self.workgroup_size = workgroup_size

    def run(self, repeat: int = 1, wait: bool = True) -> None:
        if self.out is None:
            return
        self.device.dispatch(self.pipeline, self.bind_group, self.grid, repeat=repeat, wait=wait)

    def encode(self, repeat: int = 1) -> Any:
        """A command buffer of ``repeat`` dispatches, for ``device.submit`` (benchmarks time the submit alone)."""
        return self.device.encode(self.pipeline, self.bind_group, self.grid, repeat=repeat)

    def result(self) -> torch.Tensor:
        if self.out is None:
            return torch.empty(self.shape, dtype=self.dtype)
        return self.device.read(self.out, self.shape, self.dtype)


def prepare(
    args: RmsNormArgs,
    device: GpuDevice,
    pipeline_for: PipelineFactory,
    *,
    where: str,
    workgroup_size: Optional[int] = None,
    cache_keys: Optional[Mapping[int, str]] = None,
    workgroup_limit: Optional[int] = None,
    workgroup_limit_reason: str = "",
) -> PreparedRmsNorm:
    """Upload x (and the weight, once per cache key), build the pipeline, bind; dispatch nothing yet.

    ``cache_keys[1]``, when given, identifies the weight's bytes (the named-data
    key a .pte stores it under) so it is uploaded once and reused.
    """
    shape, dtype = tuple(args.x.shape), args.x.dtype
    units = args.width // args.lanes
    wg = choose_workgroup_size(
        device, units, workgroup_size, where=where, row_elements=args.width,
        limit=workgroup_limit, limit_reason=workgroup_limit_reason,
    )
    if args.rows == 0:
        return PreparedRmsNorm(device, None, None, (0, 0, 0), None, shape, dtype, wg)
    nbytes = args.x.numel() * args.x.element_size()
    if nbytes > device.max_binding_bytes:
        raise KernelError(
            f"{where}: x of shape {shape} needs {nbytes} bytes, but {device.summary} binds at most "
            f"{device.max_binding_bytes} bytes per storage buffer; split the rows into smaller calls"
        )
    grid = device.grid(args.rows)  # raises past a 2-D dispatch's reach
    pipe = pipeline_for(device, dtype, args.lanes, wg)
    xb = device.upload(args.x, what=f"{where}: x")
    key = (cache_keys or {}).get(1)
    wb = device.constant(key, args.weight, what=f"{where}: weight") if key else device.upload(args.weight, what=f"{where}: weight")
    yb = device.empty(nbytes, what=f"{where}: y")
    params = device.uniform(struct.pack("<IIff", args.rows, units, float(args.width), args.eps))
    bind = device.bind(pipe, (xb, wb, yb, params))
    return PreparedRmsNorm(device, pipe, bind, grid, yb, shape, dtype, wg)


def reference(x: torch.Tensor, weight: torch.Tensor, eps: Optional[float] = None) -> torch.Tensor:
    """What the kernels compute, in torch: fp32 math, result in x's dtype."""
    eps = DEFAULT_EPS if eps is None else eps
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)
