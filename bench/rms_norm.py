"""Benchmark: et_vk.rms_norm kernels (WGSL for webgpu, GLSL for vulkan, through wgpu) vs torch.

For each rows x width (fp32) it reports the bandwidth each implementation moves,
counting x read, the weight read and y written, and the ratios:

- ours / torch ``F.rms_norm`` on the same machine (CUDA when torch sees a GPU,
  else the CPU);
- on a GPU, ours / the device-to-device copy bandwidth (``y.copy_(x)``, bytes
  read + written), the ceiling for a memory-bound kernel.

Our time is wall time from submitting a command buffer of N dispatches to its
completion, divided by N (encoding happens before the clock starts); torch's is
CUDA-event time over N calls (wall time on the CPU). Each figure is the best of
``--trials`` batches of at least ``--min-time`` seconds. Every size is checked
against ``F.rms_norm`` before it is timed.

Needs torch, numpy and wgpu; not executorch, not an installed edgeplug (the
repository's folders are put on sys.path).

    python bench/rms_norm.py                           # the default sweep
    python bench/rms_norm.py --sizes 1x4096,4096x4096 --json out.json
    EDGEPLUG_WGPU_ADAPTER=nvidia python bench/rms_norm.py --tune
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for sub in ("core", "plugins/webgpu", "plugins/vulkan"):
    sys.path.insert(0, str(ROOT / sub))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from edgeplug.errors import KernelError  # noqa: E402
from edgeplug.runtime.device import get_device  # noqa: E402
from edgeplug_vulkan.kernels import prepare_rms_norm as prepare_glsl  # noqa: E402
from edgeplug_webgpu.kernels import prepare_rms_norm as prepare_wgsl  # noqa: E402

KERNELS = {"wgsl": prepare_wgsl, "glsl": prepare_glsl}
DEFAULT_SIZES = [
    (1, 4096), (64, 4096), (1024, 4096), (4096, 4096), (16384, 4096), (65536, 4096),
    (4096, 1024), (4096, 5000), (4096, 8192), (16384, 8192), (32768, 8192), (65536, 8192),
]
EPS = 1e-6


def parse_sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        r, w = part.lower().split("x")
        out.append((int(r), int(w)))
    return out


def moved_bytes(rows: int, width: int) -> int:
    return (2 * rows * width + width) * 4  # read x and w, write y (fp32)


def time_ours(prepared, min_time: float, trials: int) -> float:
    """Seconds per dispatch."""
    dev = prepared.device
    prepared.run()  # warm: pipeline, caches

    def batch(n: int) -> float:
        cb = prepared.encode(n)
        t = time.perf_counter()
        dev.submit(cb, wait=True)
        return time.perf_counter() - t

    n = 1
    while n < 4096 and batch(n) < min_time:  # grow the batch until it is long enough to time
        n *= 2
    return min(batch(n) for _ in range(trials)) / n


def time_torch(fn, cuda: bool, min_time: float, trials: int) -> float:
    fn()

    def batch(n: int) -> float:
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t

    n = 1
    while n < 8192 and batch(n) < min_time:
        n *= 2
    return min(batch(n) for _ in range(trials)) / n


def check(prepared, x: torch.Tensor, w: torch.Tensor) -> float:
    prepared.run()
    y = prepared.result()
    rows = x.shape[0]
    pick = torch.cat([torch.arange(0, min(rows, 64)), torch.arange(max(0, rows - 64), rows)]).unique()
    ref = F.rms_norm(x[pick], (x.shape[1],), w, EPS)
    return (y[pick] - ref).abs().max().item()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=parse_sizes, default=DEFAULT_SIZES, help="ROWSxWIDTH,... (default: a sweep)")
    p.add_argument("--kernels", default="wgsl,glsl", help="which of ours: wgsl,glsl")
    p.add_argument("--max-mib", type=float, default=None, help="skip sizes whose x is larger (default: the adapter's binding limit)")
    p.add_argument("--min-time", type=float, default=0.05, help="seconds per timed batch")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--workgroup-size", type=int, default=None, help="force a workgroup size (default: the kernels' choice)")
    p.add_argument("--tune", action="store_true", help="also time workgroup sizes 32..1024 on the largest size")
    p.add_argument("--torch-threads", type=int, default=None, help="torch.set_num_threads for the CPU baseline")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    dev = get_device()
    cuda = torch.cuda.is_available()
    tdev = "cuda" if cuda else "cpu"
    kernels = [k for k in args.kernels.split(",") if k]
    info = {
        "adapter": dev.describe(),
        "torch": torch.__version__,
        "torch_device": torch.cuda.get_device_name() if cuda else f"CPU ({torch.get_num_threads()} threads, {platform.processor() or platform.machine()})",
        "dtype": "float32",
        "eps": EPS,
    }
    print(f"# adapter: {info['adapter']}\n# torch {info['torch']} on {info['torch_device']}", flush=True)
    limit = dev.max_binding_bytes if args.max_mib is None else min(dev.max_binding_bytes, int(args.max_mib * 2**20))

    copy_gbs = None
    if cuda:
        n = 256 * 2**20  # 1 GiB of fp32
        a, b = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
        copy_s = time_torch(lambda: b.copy_(a), True, args.min_time, args.trials)
        copy_gbs = 2 * n * 4 / copy_s / 1e9
        info["copy_GBps"] = copy_gbs
        print(f"# device-to-device copy (torch, 1 GiB): {copy_gbs:.0f} GB/s read+written", flush=True)
        del a, b

    rows_out = []
    header = ["rows x width", "MiB"] + [f"{k} GB/s" for k in kernels] + ["torch GB/s"] + [f"{k}/torch" for k in kernels]
    if cuda:
        header += [f"{k}/copy" for k in kernels] + ["torch/copy"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for rows, width in args.sizes:
        nbytes = rows * width * 4
        if nbytes > limit:
            print(f"| {rows}x{width} | {nbytes / 2**20:.0f} | skipped: x is larger than {limit / 2**20:.0f} MiB (binding limit or --max-mib) |", flush=True)
            continue
        g = torch.Generator().manual_seed(rows * 7919 + width)
        x = torch.randn(rows, width, generator=g)
        w = 1 + 0.1 * torch.randn(width, generator=g)
        rec = {"rows": rows, "width": width, "bytes_moved": moved_bytes(rows, width)}
        for k in kernels:
            try:
                prepared = KERNELS[k](x, w, EPS, device=dev, workgroup_size=args.workgroup_size)
                err = check(prepared, x, w)
                if err > 1e-4:
                    raise KernelError(f"max |difference| vs F.rms_norm {err:.2e}; not timing a wrong kernel")
                s = time_ours(prepared, args.min_time, args.trials)
            except Exception as exc:  # record and go on: one size's failure must not lose the sweep
                rec[k] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"# {k} {rows}x{width}: {rec[k]['error']}", flush=True)
                continue
            rec[k] = {"seconds": s, "GBps": rec["bytes_moved"] / s / 1e9, "max_abs_diff": err, "workgroup_size": prepared.workgroup_size}
            del prepared
        xt, wt = x.to(tdev), w.to(tdev)
        s = time_torch(lambda: F.rms_norm(xt, (width,), wt, EPS), cuda, args.min_time, args.trials)
        rec["torch"] = {"seconds": s, "GBps": rec["bytes_moved"] / s / 1e9}
        del xt, wt
        rows_out.append(rec)
        gbs = lambda k: rec[k]["GBps"] if "GBps" in rec.get(k, {}) else float("nan")  # noqa: E731
        cells = [f"{rows}x{width}", f"{nbytes / 2**20:.1f}"] + [f"{gbs(k):.1f}" for k in kernels] + [f"{gbs('torch'):.1f}"]
        cells += [f"{gbs(k) / gbs('torch'):.2f}" for k in kernels]
        if cuda:
            cells += [f"{gbs(k) / copy_gbs:.2f}" for k in kernels] + [f"{gbs('torch') / copy_gbs:.2f}"]
        print("| " + " | ".join(cells) + " |", flush=True)

    tune = []
    if args.tune and rows_out:
        big = max(rows_out, key=lambda r: r["bytes_moved"])
        rows, width = big["rows"], big["width"]
        g = torch.Generator().manual_seed(1)
        x, w = torch.randn(rows, width, generator=g), torch.ones(width)
        print(f"\n# workgroup sizes at {rows}x{width} (GB/s)")
        for k in kernels:
            line = []
            for wg in (8, 16, 32, 64, 128, 256, 512, 1024):
                try:
                    prepared = KERNELS[k](x, w, EPS, device=dev, workgroup_size=wg)
                except KernelError:
                    continue  # past the kernel's or the adapter's limit
                err = check(prepared, x, w)
                if err > 1e-4:
                    tune.append({"kernel": k, "workgroup_size": wg, "error": err})
                    line.append(f"{wg}: wrong ({err:.1e})")
                    continue
                s = time_ours(prepared, args.min_time, args.trials)
                gb = moved_bytes(rows, width) / s / 1e9
                tune.append({"kernel": k, "workgroup_size": wg, "GBps": gb})
                line.append(f"{wg}: {gb:.1f}")
                del prepared
            print(f"# {k}: " + ", ".join(line), flush=True)

    if args.json:
        Path(args.json).write_text(json.dumps({"info": info, "results": rows_out, "tune": tune}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
