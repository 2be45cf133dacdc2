"""The ``et_vk.rms_norm`` kernel contract every backend on the Vulkan delegate implements.

``y = x * rsqrt(mean(x**2, -1) + eps) * weight`` over the last dimension,
accumulated in fp32 whatever the storage dtype. The plugins own the shaders
(WGSL for WebGPU, GLSL compiled to SPIR-V for Vulkan); this module owns what
both must agree on: argument checks that fail before dispatch, the buffer
layout and parameter block the shaders read, the workgroup shape, and the
launch.

Buffer layout: rows are stored in 16-byte units, 4 floats (fp32) or 8 halves
(fp16, packed two to a 32-bit word, so no adapter feature is needed for
them). A row whose width is not a multiple of the unit is padded with zeros
on upload (zeros add nothing to the sum of squares; the mean divides by the
true width) and the padding is dropped on read-back.

Workgroup shape (``WorkgroupShape``, the same for both kernels): a workgroup
of ``invocations`` normalises ``rows = invocations / row_invocations`` rows;
each invocation keeps ``items`` units of its row in registers, so a row that
fits (``row_invocations * items`` units) is read from memory once; with few
units (``WorkgroupShape.straight_loads``) it loads them and their weights
without branches, before the reduction. The
partial sums of a row are added with subgroup shuffles where the adapter has
subgroups (then one barrier when a row spans several subgroups), else with a
tree in workgroup memory.

Parameter block (16 bytes, same layout for WGSL and GLSL std140)::

    rows: u32    rows to normalise
    units: u32   row length in 16-byte units (the row stride)
    n: f32       row length in elements (the mean's divisor)
    eps: f32
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional

import torch

from edgeplug.plugin import GpuDevice, KernelError, gpu_device

OP = "et_vk.rms_norm.default"
#: the eps the op takes when the graph gives none (float32 machine epsilon)
DEFAULT_EPS = float(torch.finfo(torch.float32).eps)
#: bytes per storage unit (a vec4 of fp32 or 8 packed fp16): one 16-byte load
UNIT_BYTES = 16
#: default shape on a GPU, fp32 and fp16 alike: a row's invocations cover it in about ITEMS_TARGET
#: units each, at most MAX_ROW_INVOCATIONS per row; narrow rows share a workgroup of
#: WORKGROUP_TARGET invocations. Tuned on an H200 (docs/benchmarks.md): at 4096x4096 fp32,
#: 256 x 4 units moved 0.90 of the copy bandwidth (WGSL and GLSL), 128 x 8 0.80 / 0.87; at
#: 16384x8192 fp16, 256 x 4 moved 0.97 where the earlier fp16 default, 128 x 8, moved 0.95;
#: at 4096x4096 fp16, 128 x 4 moved 0.85 / 0.85 (0.79 / 0.72 with guarded loads).
ITEMS_TARGET = 4
MAX_ROW_INVOCATIONS = 512
WORKGROUP_TARGET = 128
#: up to this many units in registers, an invocation loads its units of x and of the weight
#: unconditionally before the reduction (addresses clamped into the buffers, units past the row
#: zeroed with a select), so all its loads are in flight at once and the weight's latency is not
#: paid after the reduction. With more units, the extra registers cost more than they give (the
#: GLSL kernel at 8 units, fp16 16384x8192: 0.80 of copy against 0.95 with guarded loads), so
#: loads are guarded by branches and the weight is read when y is written.
STRAIGHT_LOADS_MAX_ITEMS = 5
#: units one invocation keeps in registers at most; the rest of a wider row is read twice
MAX_ITEMS = 16

#: builds (or fetches from the device's cache) the pipeline for (storage dtype, shape)
PipelineFactory = Callable[[GpuDevice, torch.dtype, "WorkgroupShape"], Any]


def elements_per_unit(dtype: torch.dtype) -> int:
    """Elements in one 16-byte storage unit: 4 fp32 or 8 fp16."""
    return UNIT_BYTES // torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class WorkgroupShape:
    """How a dispatch maps rows onto invocations; the same for the WGSL and the GLSL kernel."""

    #: invocations per workgroup (a power of two)
    invocations: int
    #: invocations per row (a power of two dividing ``invocations``)
    row_invocations: int
    #: 16-byte units each invocation keeps in registers (0: read the row twice, keeping nothing)
    items: int
    #: reduce with subgroup shuffles (the adapter has subgroups); else a shared-memory tree
    subgroups: bool

    @property
    def rows(self) -> int:
        """Rows per workgroup."""
        return self.invocations // self.row_invocations

    @property
    def straight_loads(self) -> bool:
        """Registers loaded without branches, the weight with x (``0 < items <= STRAIGHT_LOADS_MAX_ITEMS``)."""
        return 0 < self.items <= STRAIGHT_LOADS_MAX_ITEMS

    def tag(self) -> str:
        """Short name for labels and benchmark tables, e.g. ``256x1 i4 sg``."""
        return f"{self.row_invocations}x{self.rows} i{self.items} {'sg' if self.subgroups else 'smem'}"


@dataclass(frozen=True)
class RmsNormArgs:
    """Checked arguments: contiguous host tensors and the resolved eps."""

    x: torch.Tensor
    weight: torch.Tensor
    eps: float
    rows: int
    width: int

    @property
    def units(self) -> int:
        """Row length in 16-byte storage units (the padded row stride)."""
        return -(-self.width // elements_per_unit(self.x.dtype))


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


def _pow2(n: int) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 1 and not n & (n - 1)


def _floor_pow2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def choose_shape(
    device: GpuDevice,
    units: int,
    *,
    where: str,
    workgroup_size: Optional[int] = None,
    rows_per_workgroup: Optional[int] = None,
    items: Optional[int] = None,
    subgroups: Optional[bool] = None,
) -> WorkgroupShape:
    """The workgroup shape for rows of ``units`` 16-byte units (fp32 or fp16); any argument given overrides the default.

    Default on a GPU: ``row_invocations`` the power of two giving each invocation
    about ``ITEMS_TARGET`` units (at most ``MAX_ROW_INVOCATIONS``), rows packed into
    workgroups of ``WORKGROUP_TARGET`` invocations, every unit of a row in registers up to ``MAX_ITEMS``; on a CPU adapter
    (llvmpipe) one subgroup per workgroup, since its subgroup is one SIMD loop
    and wider groups only add barrier cost. ``workgroup_size`` alone means one
    row per workgroup.
    """
    cap = min(device.max_workgroup_size, int(device.limits.get("max-compute-workgroup-storage-size", 16384)) // 4)
    sg = device.subgroup_size
    if subgroups is None:
        subgroups = sg is not None
    elif subgroups and sg is None:
        raise KernelError(f"{where}: subgroup reduction asked for, but {device.summary} has no subgroup operations")
    if workgroup_size is not None:
        if not _pow2(workgroup_size):
            raise KernelError(f"{where}: workgroup_size must be a power of two >= 1, got {workgroup_size!r}")
        if workgroup_size > cap:
            raise KernelError(f"{where}: workgroup_size {workgroup_size} exceeds what {device.summary} allows ({cap})")
    if rows_per_workgroup is not None and not _pow2(rows_per_workgroup):
        raise KernelError(f"{where}: rows_per_workgroup must be a power of two >= 1, got {rows_per_workgroup!r}")

    if workgroup_size is not None:
        wg = workgroup_size
        rows = rows_per_workgroup or 1
        if rows > wg:
            raise KernelError(f"{where}: rows_per_workgroup {rows} exceeds workgroup_size {wg}")
        per_row = wg // rows
    else:
        per_row = min(_floor_pow2(units // ITEMS_TARGET), MAX_ROW_INVOCATIONS, cap)
        target = WORKGROUP_TARGET
        if device.adapter_type == "CPU" and sg:
            # llvmpipe runs a subgroup as one SIMD loop: wider groups only add barrier cost
            # (measured at 4096x5000: 8 invocations 2.6 GB/s, 256 1.1 GB/s)
            per_row, target = min(per_row, sg), sg
        if rows_per_workgroup is not None:
            rows = rows_per_workgroup
        else:
            rows = max(1, min(target, cap) // per_row)
        wg = per_row * rows
        if wg > cap:
            raise KernelError(f"{where}: {rows} rows per workgroup of {per_row} invocations exceed what {device.summary} allows ({cap})")
    if items is None:
        items = min(MAX_ITEMS, max(1, -(-units // per_row)))
    elif isinstance(items, bool) or not isinstance(items, int) or not 0 <= items <= MAX_ITEMS:
        raise KernelError(f"{where}: items must be an int in 0..{MAX_ITEMS}, got {items!r}")
    return WorkgroupShape(invocations=wg, row_invocations=per_row, items=items, subgroups=bool(subgroups))


class PreparedRmsNorm:
    """Buffers bound and pipeline built: ``run()`` dispatches, ``result()`` reads y back."""

    def __init__(self, device: GpuDevice, pipeline: Any, bind_group: Any, grid: tuple[int, int, int], out: Any, shape: tuple, dtype: torch.dtype, workgroup_size: int, *, layout: Optional[WorkgroupShape] = None, buffers: tuple = (), pipeline_for: Optional[PipelineFactory] = None, width: int = 0, units: int = 0, rows: int = 0) -> None:
        self.device = device
        self.pipeline = pipeline
        self.bind_group = bind_group
        self.grid = grid
        self.out = out
        self.shape = shape
        self.dtype = dtype
        self.workgroup_size = workgroup_size
        #: the WorkgroupShape this dispatch uses
        self.layout = layout
        self._buffers = buffers
        self._pipeline_for = pipeline_for
        self._width, self._units, self._rows = width, units, rows

    def run(self, repeat: int = 1, wait: bool = True) -> None:
        if self.out is None:
            return
        self.device.dispatch(self.pipeline, self.bind_group, self.grid, repeat=repeat, wait=wait)

    def encode(self, repeat: int = 1) -> Any:
        """A command buffer of ``repeat`` dispatches, for ``device.submit`` (benchmarks time the submit alone)."""
        return self.device.encode(self.pipeline, self.bind_group, self.grid, repeat=repeat)

    def with_layout(self, layout: WorkgroupShape, pipeline_for: Optional[PipelineFactory] = None) -> "PreparedRmsNorm":
        """The same buffers dispatched with another workgroup shape, or another kernel's pipeline (benchmarks: no second upload)."""
        pipeline_for = pipeline_for or self._pipeline_for
        if self.out is None or pipeline_for is None:
            raise KernelError("nothing to dispatch: zero rows")
        pipe = pipeline_for(self.device, self.dtype, layout)
        bind = self.device.bind(pipe, self._buffers)
        grid = self.device.grid(-(-self._rows // layout.rows))
        return PreparedRmsNorm(
            self.device, pipe, bind, grid, self.out, self.shape, self.dtype, layout.invocations, layout=layout,
            buffers=self._buffers, pipeline_for=pipeline_for, width=self._width, units=self._units, rows=self._rows,
        )

    def read_rows(self, start: int, count: int) -> torch.Tensor:
        """Rows ``start .. start+count`` of y as a (count, width) tensor (a partial read-back)."""
        per = elements_per_unit(self.dtype)
        row_bytes = self._units * UNIT_BYTES
        count = max(0, min(count, self._rows - start))
        if self.out is None or count == 0:
            return torch.empty((count, self._width), dtype=self.dtype)
        flat = self.device.read(self.out, (count * self._units * per,), self.dtype, offset=start * row_bytes)
        return flat.reshape(count, self._units * per)[:, : self._width]

    def result(self) -> torch.Tensor:
        if self.out is None:
            return torch.empty(self.shape, dtype=self.dtype)
        return self.read_rows(0, self._rows).reshape(self.shape)


def _padded(t: torch.Tensor, width: int, units: int) -> torch.Tensor:
    """``t`` (rows x width, or width) with each row zero-padded to ``units`` 16-byte units."""
    full = units * elements_per_unit(t.dtype)
    if full == width:
        return t
    return torch.nn.functional.pad(t, (0, full - width))


def prepare(
    args: RmsNormArgs,
    device: GpuDevice,
    pipeline_for: PipelineFactory,
    *,
    where: str,
    workgroup_size: Optional[int] = None,
    rows_per_workgroup: Optional[int] = None,
    items: Optional[int] = None,
    subgroups: Optional[bool] = None,
    cache_keys: Optional[Mapping[int, str]] = None,
) -> PreparedRmsNorm:
    """Upload x (and the weight, once per cache key), build the pipeline, bind; dispatch nothing yet.

    ``cache_keys[1]``, when given, identifies the weight's bytes (the named-data
    key a .pte stores it under) so it is uploaded once and reused.
    """
    shape, dtype = tuple(args.x.shape), args.x.dtype
    units = args.units
    layout = choose_shape(
        device, units, where=where, workgroup_size=workgroup_size, rows_per_workgroup=rows_per_workgroup,
        items=items, subgroups=subgroups,
    )
    if args.rows == 0:
        return PreparedRmsNorm(device, None, None, (0, 0, 0), None, shape, dtype, layout.invocations, layout=layout)
    nbytes = args.rows * units * UNIT_BYTES
    if nbytes > device.max_binding_bytes:
        raise KernelError(
            f"{where}: x of shape {shape} needs {nbytes} bytes, but {device.summary} binds at most "
            f"{device.max_binding_bytes} bytes per storage buffer; split the rows into smaller calls"
        )
    grid = device.grid(-(-args.rows // layout.rows))  # raises past a 2-D dispatch's reach
    pipe = pipeline_for(device, dtype, layout)
    xb = device.upload(_padded(args.x.reshape(args.rows, args.width), args.width, units), what=f"{where}: x")
    key = (cache_keys or {}).get(1)
    weight = _padded(args.weight, args.width, units)
    wb = device.constant(key, weight, what=f"{where}: weight") if key else device.upload(weight, what=f"{where}: weight")
    yb = device.empty(nbytes, what=f"{where}: y")
    params = device.uniform(struct.pack("<IIff", args.rows, units, float(args.width), args.eps))
    buffers = (xb, wb, yb, params)
    bind = device.bind(pipe, buffers)
    return PreparedRmsNorm(
        device, pipe, bind, grid, yb, shape, dtype, layout.invocations, layout=layout, buffers=buffers,
        pipeline_for=pipeline_for, width=args.width, units=units, rows=args.rows,
    )


@dataclass(frozen=True)
class ShaderKernel:
    """A plugin's ``et_vk.rms_norm`` entry points around its own shader (``pipeline``).

    A GPU plugin builds one from what is its own, where errors say they come
    from (``where``), the storage dtypes its shader reads and its pipeline
    factory, and exposes ``prepare`` and ``rms_norm``; the checks, upload,
    shape choice and launch are this module's.
    """

    where: str
    dtypes: tuple[torch.dtype, ...]
    pipeline: PipelineFactory

    def prepare(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: Optional[float] = None,
        *,
        device: Optional[GpuDevice] = None,
        workgroup_size: Optional[int] = None,
        cache_keys: Optional[Mapping[int, str]] = None,
        rows_per_workgroup: Optional[int] = None,
        items: Optional[int] = None,
        subgroups: Optional[bool] = None,
    ) -> PreparedRmsNorm:
        """Check, upload and bind; ``.run()`` dispatches and ``.result()`` reads y (benchmarks time ``run``).

        ``workgroup_size``, ``rows_per_workgroup``, ``items`` and ``subgroups``
        override parts of the default shape (``choose_shape``).
        """
        device = device or gpu_device()
        args = check_args(x, weight, eps, where=self.where, dtypes=self.dtypes)
        return prepare(
            args, device, self.pipeline, where=self.where, workgroup_size=workgroup_size,
            rows_per_workgroup=rows_per_workgroup, items=items, subgroups=subgroups, cache_keys=cache_keys,
        )

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: Optional[float] = None, **options: Any) -> torch.Tensor:
        """``et_vk.rms_norm(x, weight, eps)`` through the shader; a CPU tensor of x's shape and dtype.

        eps None means float32 machine epsilon; ``options`` are ``prepare``'s.
        Raises ``edgeplug.plugin.KernelError`` before dispatch on a bad shape,
        dtype, weight length, eps or workgroup shape, and when the shader
        cannot be built.
        """
        prepared = self.prepare(x, weight, eps, **options)
        prepared.run()
        return prepared.result()


def reference(x: torch.Tensor, weight: torch.Tensor, eps: Optional[float] = None) -> torch.Tensor:
    """What the kernels compute, in torch: fp32 math, result in x's dtype."""
    eps = DEFAULT_EPS if eps is None else eps
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)
