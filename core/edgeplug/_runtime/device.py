"""The wgpu device layer: adapter choice, and a device with cached pipelines and constants.

Only torch, numpy and wgpu are needed here (no executorch), so kernels and the
benchmarks run on machines where executorch is not installed.

Adapter choice: ``EDGEPLUG_WGPU_ADAPTER`` (a case-insensitive substring of the
adapter summary, e.g. ``nvidia``, ``llvmpipe``, ``vulkan``; ``none`` disables
the adapter) picks one; otherwise a hardware GPU is preferred (discrete, then
integrated, then virtual), Mesa's llvmpipe (a CPU adapter) is the fallback,
and among equals the Vulkan backend wins, since the Vulkan plugin's GLSL
kernels target it.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from edgeplug._errors import KernelError

ADAPTER_ENV = "EDGEPLUG_WGPU_ADAPTER"

#: storage dtypes a buffer may hold, and the numpy dtype used to move them
_NUMPY = {
    torch.float32: np.float32,
    torch.float16: np.float16,
    torch.int32: np.int32,
    torch.uint32: np.uint32,
}

#: the first word of a SPIR-V module (little-endian)
SPIRV_MAGIC = (0x07230203).to_bytes(4, "little")

_TYPE_RANK = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3}


class NoAdapterError(KernelError):
    """No wgpu adapter can be used on this machine (or the environment disabled it)."""


@dataclass(frozen=True)
class AdapterInfo:
    """What selection needs to know about one adapter."""

    summary: str
    adapter_type: str
    backend_type: str

    @property
    def rank(self) -> tuple[int, int]:
        return (_TYPE_RANK.get(self.adapter_type, 4), 0 if self.backend_type == "Vulkan" else 1)


def choose_adapter(candidates: Sequence[AdapterInfo], wanted: Optional[str]) -> int:
    """Index of the adapter to use among ``candidates``.

    ``wanted`` is the value of ``EDGEPLUG_WGPU_ADAPTER`` (None or empty: choose
    by preference). Raises NoAdapterError naming what is there when nothing fits.
    """
    listed = "; ".join(c.summary for c in candidates) or "none"
    if wanted is not None and wanted.strip().lower() == "none":
        raise NoAdapterError(f"wgpu adapters are disabled by {ADAPTER_ENV}=none (adapters here: {listed})")
    if not candidates:
        raise NoAdapterError(
            "wgpu found no adapter on this machine; install a Vulkan driver "
            "(on Debian/Ubuntu: apt-get install mesa-vulkan-drivers libvulkan1 for llvmpipe)"
        )
    order = sorted(range(len(candidates)), key=lambda i: candidates[i].rank)
    if wanted and wanted.strip():
        needle = wanted.strip().lower()
        order = [i for i in order if needle in candidates[i].summary.lower()]
        if not order:
            raise NoAdapterError(f"no wgpu adapter matches {ADAPTER_ENV}={wanted!r}; adapters here: {listed}")
    return order[0]


@dataclass(frozen=True)
class ShaderModuleRecord:
    """One shader module handed to wgpu: its label, "wgsl" or "spirv", and the sha256 of its code."""

    label: str
    language: str
    sha256: str


class GpuDevice:
    """One wgpu device with the adapter's full limits, plus pipeline and constant caches."""

    def __init__(self, adapter: Any) -> None:
        import wgpu  # an optional dependency (edgeplug[gpu])

        self._wgpu = wgpu
        self.adapter = adapter
        self.summary: str = adapter.summary
        self.adapter_type: str = adapter.info.get("adapter_type", "")
        self.backend_type: str = adapter.info.get("backend_type", "")
        self.features: frozenset[str] = frozenset(adapter.features)
        # subgroup: the kernels' shuffle reductions; shader-f16 for kernels that want f16 arithmetic
        # (the rms_norm kernels store fp16 packed in 32-bit words and need no feature for it)
        optional = ("shader-f16", "subgroup", "timestamp-query")
        wanted = [f for f in optional if f in self.features]
        self.enabled: frozenset[str] = frozenset(wanted)
        # Software adapters and browsers default storage limits far below what
        # the hardware allows; ask for everything the adapter offers.
        self.device = adapter.request_device_sync(
            label="edgeplug", required_features=wanted, required_limits=dict(adapter.limits)
        )
        self.limits: dict[str, int] = dict(self.device.limits)
        self.has_f16 = "shader-f16" in wanted
        self._pipelines: dict[tuple, Any] = {}
        self._constants: dict[str, tuple[Any, int]] = {}
        self._lock = threading.Lock()
        self._scratch: Any = None
        self._subgroup_size: Optional[int] = None
        #: every shader module created on this device, in order (tests check what reached wgpu)
        self.shader_modules: list[ShaderModuleRecord] = []

    @property
    def subgroup_size(self) -> Optional[int]:
        """The subgroup size compute pipelines get here (probed once), or None without usable subgroups.

        wgpu-py 0.32 does not report the adapter's subgroup sizes, so a one-
        workgroup WGSL probe reads ``@builtin(subgroup_size)``. The kernels' shuffle
        reductions also rely on each subgroup being a run of consecutive invocations
        (invocation i is lane i % size): the probe checks that for a whole workgroup,
        and where it does not hold, this is None and kernels use workgroup memory.
        """
        if "subgroup" not in self.enabled:
            return None
        if self._subgroup_size is None:
            n = min(256, self.max_workgroup_size)
            probe = (
                "@group(0) @binding(0) var<storage, read_write> out: array<u32>;\n"
                f"@compute @workgroup_size({n}) fn main(@builtin(subgroup_size) s: u32, "
                "@builtin(subgroup_invocation_id) lane: u32, @builtin(local_invocation_index) i: u32) "
                f"{{ out[i] = s; out[{n}u + i] = lane; }}"
            )
            pipe = self.pipeline(probe, label="subgroup layout probe")
            buf = self.empty(8 * n, what="subgroup layout probe")
            self.dispatch(pipe, self.bind(pipe, [buf]), (1, 1, 1))
            got = self.read(buf, (2, n), torch.int32)
            sizes, lanes = set(got[0].tolist()), got[1].tolist()
            size = sizes.pop() if len(sizes) == 1 else 0
            runs = size > 0 and not size & (size - 1) and all(lane == i % size for i, lane in enumerate(lanes))
            self._subgroup_size = size if runs else 0
        return self._subgroup_size or None

    # limits -------------------------------------------------------------------
    @property
    def max_binding_bytes(self) -> int:
        return int(self.limits["max-storage-buffer-binding-size"])

    @property
    def max_groups_per_dim(self) -> int:
        return int(self.limits["max-compute-workgroups-per-dimension"])

    @property
    def max_workgroup_size(self) -> int:
        return int(min(self.limits["max-compute-invocations-per-workgroup"], self.limits["max-compute-workgroup-size-x"]))

    def grid(self, groups: int) -> tuple[int, int, int]:
        """Spread ``groups`` workgroups over x and y: rows past the per-dimension limit go to y.

        A shader recovers its index as ``wid.x + wid.y * num_workgroups.x`` and
        returns when that is past the count (the last y-row may be partial).
        """
        if groups < 1:
            raise KernelError(f"cannot dispatch {groups} workgroups")
        limit = self.max_groups_per_dim
        if groups <= limit:
            return (groups, 1, 1)
        y = -(-groups // limit)
        if y > limit:
            raise KernelError(
                f"{groups} workgroups exceed what a 2-D dispatch reaches on {self.summary} "
                f"({limit} x {limit}); split the input"
            )
        return (-(-groups // y), y, 1)

    # pipelines ----------------------------------------------------------------
    def pipeline(self, source: Union[str, bytes], *, label: str, entry_point: str = "main", constants: Optional[Mapping[str, float]] = None) -> Any:
        """A compute pipeline for ``source``, cached: WGSL text, or SPIR-V as bytes.

        GLSL text is refused: wgpu would translate it with naga's GLSL frontend,
        which compiles ``barrier()`` with subgroup scope (workgroups larger than a
        subgroup then race). Compile GLSL to SPIR-V with glslang first, as the
        Vulkan plugin does. ``label`` names the pipeline in errors; every module
        created is recorded in ``shader_modules``.
        """
        if isinstance(source, (bytes, bytearray, memoryview)):
            code: Union[str, bytes] = bytes(source)
            if len(code) < 20 or len(code) % 4 or code[:4] not in (SPIRV_MAGIC, SPIRV_MAGIC[::-1]):
                raise KernelError(f"shader {label!r}: {len(code)} bytes that are not a SPIR-V module (no SPIR-V magic number)")
            language = "spirv"
        elif isinstance(source, str):
            if source.lstrip().startswith("#version"):
                raise KernelError(
                    f"shader {label!r} is GLSL text; wgpu would compile it with naga's GLSL frontend, which "
                    "gives barrier() subgroup scope. Compile it to SPIR-V with glslang and pass the bytes"
                )
            code, language = source, "wgsl"
        else:
            raise KernelError(f"shader {label!r}: expected WGSL text or SPIR-V bytes, got {type(source).__name__}")
        consts = tuple(sorted((constants or {}).items()))
        digest = hashlib.sha256(code if isinstance(code, bytes) else code.encode()).hexdigest()
        key = (digest, label, entry_point, consts)
        with self._lock:
            hit = self._pipelines.get(key)
            if hit is not None:
                return hit
            try:
                module = self.device.create_shader_module(label=label, code=code)
                stage: dict[str, Any] = {"module": module, "entry_point": entry_point}
                if consts:
                    stage["constants"] = dict(consts)
                pipe = self.device.create_compute_pipeline(label=label, layout="auto", compute=stage)
            except Exception as exc:
                raise KernelError(f"shader {label!r} ({language}) did not compile on {self.summary}: {exc}") from exc
            self._pipelines[key] = pipe
            self.shader_modules.append(ShaderModuleRecord(label=label, language=language, sha256=digest))
            return pipe

    # buffers ------------------------------------------------------------------
    def _check_size(self, nbytes: int, what: str) -> None:
        if nbytes > self.max_binding_bytes:
            raise KernelError(
                f"{what} needs {nbytes} bytes, but {self.summary} binds at most "
                f"{self.max_binding_bytes} bytes per storage buffer; split the rows into smaller calls"
            )

    @staticmethod
    def _bytes(t: torch.Tensor) -> bytes:
        if t.dtype not in _NUMPY:
            raise KernelError(f"cannot move a {t.dtype} tensor to the adapter (supported: {', '.join(map(str, _NUMPY))})")
        data = t.detach().to("cpu").contiguous().numpy().tobytes()
        pad = (-len(data)) % 4  # wgpu sizes are multiples of 4 bytes
        return data + b"\0" * pad if pad else data

    def upload(self, t: torch.Tensor, *, what: str = "tensor") -> Any:
        """A storage buffer holding ``t`` (contiguous)."""
        data = self._bytes(t)
        self._check_size(len(data), what)
        usage = self._wgpu.BufferUsage.STORAGE | self._wgpu.BufferUsage.COPY_SRC | self._wgpu.BufferUsage.COPY_DST
        return self.device.create_buffer_with_data(data=data or b"\0\0\0\0", usage=usage)

    def constant(self, key: str, t: torch.Tensor, *, what: str = "constant") -> Any:
        """A storage buffer for a program constant, uploaded once per ``key``.

        ``key`` must identify the bytes (e.g. the named-data key a .pte stores);
        a second upload under one key with a different size is refused.
        """
        with self._lock:
            hit = self._constants.get(key)
        nbytes = t.numel() * t.element_size()
        if hit is not None:
            if hit[1] != nbytes:
                raise KernelError(f"constant key {key!r} was uploaded with {hit[1]} bytes, now given {nbytes}")
            return hit[0]
        buf = self.upload(t, what=what)
        with self._lock:
            self._constants[key] = (buf, nbytes)
        return buf

    def empty(self, nbytes: int, *, what: str = "output") -> Any:
        size = max(4, nbytes + ((-nbytes) % 4))
        self._check_size(size, what)
        usage = self._wgpu.BufferUsage.STORAGE | self._wgpu.BufferUsage.COPY_SRC | self._wgpu.BufferUsage.COPY_DST
        return self.device.create_buffer(size=size, usage=usage)

    def clear(self, buffer: Any) -> None:
        """Fill ``buffer`` with zeros on the adapter (ordered after earlier submissions)."""
        enc = self.device.create_command_encoder()
        enc.clear_buffer(buffer)
        self.device.queue.submit([enc.finish()])

    def uniform(self, data: bytes) -> Any:
        data = data + b"\0" * ((-len(data)) % 16)
        usage = self._wgpu.BufferUsage.UNIFORM | self._wgpu.BufferUsage.COPY_DST
        return self.device.create_buffer_with_data(data=data, usage=usage)

    def read(self, buffer: Any, shape: Sequence[int], dtype: torch.dtype, *, offset: int = 0) -> torch.Tensor:
        """``shape`` elements of ``dtype`` from ``buffer``, starting ``offset`` bytes in (a multiple of 4)."""
        n = int(np.prod(shape)) if len(shape) else 1
        nbytes = n * torch.empty((), dtype=dtype).element_size()
        if n == 0:
            return torch.empty(tuple(shape), dtype=dtype)
        raw = self.device.queue.read_buffer(buffer, offset, min(nbytes + ((-nbytes) % 4), buffer.size - offset))
        arr = np.frombuffer(raw, dtype=_NUMPY[dtype], count=n).copy()
        return torch.from_numpy(arr).reshape(tuple(shape))

    # dispatch -----------------------------------------------------------------
    def bind(self, pipeline: Any, buffers: Iterable[Any]) -> Any:
        entries = [{"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}} for i, b in enumerate(buffers)]
        return self.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)

    def encode(self, pipeline: Any, bind_group: Any, grid: tuple[int, int, int], *, repeat: int = 1) -> Any:
        """A command buffer of ``repeat`` dispatches (one compute pass; wgpu orders them)."""
        enc = self.device.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipeline)
        cp.set_bind_group(0, bind_group)
        for _ in range(repeat):
            cp.dispatch_workgroups(*grid)
        cp.end()
        return enc.finish()

    def submit(self, command_buffer: Any, *, wait: bool = True) -> None:
        self.device.queue.submit([command_buffer])
        if wait:
            self.wait()

    def dispatch(self, pipeline: Any, bind_group: Any, grid: tuple[int, int, int], *, repeat: int = 1, wait: bool = True) -> None:
        """Record ``repeat`` dispatches, submit them; with ``wait``, block until they have run."""
        self.submit(self.encode(pipeline, bind_group, grid, repeat=repeat), wait=wait)

    def wait(self) -> None:
        """Block until everything submitted so far has run.

        Reads 4 bytes back through the queue (the read is ordered after earlier
        submissions); wgpu-py 0.32's on_submitted_work_done_sync is broken.
        """
        if self._scratch is None:
            self._scratch = self.empty(4, what="sync")
        self.device.queue.read_buffer(self._scratch, 0, 4)

    def describe(self) -> str:
        limit = self.max_binding_bytes
        size = f"{limit / 2**30:g} GiB" if limit >= 2**30 else f"{limit / 2**20:g} MiB"
        f16 = "shader-f16" if self.has_f16 else "no shader-f16"
        return f"{self.summary} [{self.adapter_type}; max storage binding {size}; {self.max_groups_per_dim} workgroups per dimension; {f16}]"


def open_device(adapter: Optional[str] = None) -> GpuDevice:
    """A new device on the adapter ``adapter`` names (None: the value of ``EDGEPLUG_WGPU_ADAPTER``).

    Nothing is cached here: each call opens a device of its own. Raises
    NoAdapterError saying why there is none (wgpu missing, no adapter, none
    matching, disabled with ``none``, or the device failing to open).
    """
    wanted = os.environ.get(ADAPTER_ENV) if adapter is None else adapter
    try:  # an optional dependency (edgeplug[gpu]): its absence is a clear NoAdapterError
        import wgpu
    except ImportError as exc:
        raise NoAdapterError(f"wgpu is not installed ({exc}); pip install wgpu") from exc
    try:
        adapters = list(wgpu.gpu.enumerate_adapters_sync())
    except Exception as exc:
        raise NoAdapterError(f"wgpu could not list adapters: {exc}") from exc
    infos = [AdapterInfo(a.summary, a.info.get("adapter_type", ""), a.info.get("backend_type", "")) for a in adapters]
    chosen = adapters[choose_adapter(infos, wanted)]
    try:
        return GpuDevice(chosen)
    except Exception as exc:
        raise NoAdapterError(f"could not open a device on {chosen.summary}: {exc}") from exc


class DeviceCache:
    """Devices opened on first use and then shared, one per adapter choice; a failure is kept as well.

    Its owner decides its lifetime: the process's one lives in the façade
    (``edgeplug._runtime.process``, published as ``edgeplug.plugin.gpu_device``); a test or a benchmark may hold its own.
    The key is the adapter choice (``EDGEPLUG_WGPU_ADAPTER``'s value when none
    is given), so changing the variable reaches another device, not a stale one.
    """

    def __init__(self) -> None:
        self._opened: dict[str, Union[GpuDevice, NoAdapterError]] = {}
        self._lock = threading.Lock()

    def get(self, adapter: Optional[str] = None) -> GpuDevice:
        """The device for ``adapter`` (None: ``EDGEPLUG_WGPU_ADAPTER``), opened now if it is the first ask."""
        wanted = os.environ.get(ADAPTER_ENV) if adapter is None else adapter
        key = (wanted or "").strip().lower()
        with self._lock:
            hit = self._opened.get(key)
            if hit is None:
                try:
                    hit = open_device(wanted or "")
                except NoAdapterError as exc:
                    hit = exc
                self._opened[key] = hit
        if isinstance(hit, NoAdapterError):
            raise NoAdapterError(str(hit))
        return hit

    def clear(self) -> None:
        """Forget every device and failure (the next ``get`` opens anew)."""
        with self._lock:
            self._opened.clear()
