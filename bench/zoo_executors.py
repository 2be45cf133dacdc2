"""Zoo throughput: cells per minute by executor and workers, on the same cells (docs/benchmarks.md).

Runs ``edgeplug._zoo.run`` on one cell set several times: local processes with
each ``--workers`` count, then Ray (a local cluster of the largest count). Per
run: wall time, cells per minute, and the mean of the cells' own process times
(start-up, export, lowering, verification). The cost model beside the table:
a run of N cells on W workers takes about ``R + ceil(N / W) * c`` where ``c``
is a cell's process time (on a W-way shared machine) and ``R`` the executor's
fixed cost (Ray: starting the cluster and its workers).

    python bench/zoo_executors.py [--models llama,qwen3] [--backends xnnpack,qnn] [--workers 1,2,4] [--layers 1] [--repeat 1]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="llama,qwen3")
    p.add_argument("--backends", default="xnnpack,qnn")
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--no-ray", action="store_true")
    p.add_argument("--repeat", type=int, default=1, help="run the whole list this many times, interleaved")
    args = p.parse_args()
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    import edgeplug._zoo as zoo

    workers = [int(w) for w in args.workers.split(",")]
    runs = ([("local", w) for w in workers] + ([] if args.no_ray else [("ray", max(workers[:2]))])) * args.repeat
    rows = []
    for executor, w in runs:
        start = time.perf_counter()
        cells = zoo.run(args.models, args.backends, "float", jobs=w, executor=executor, layers=args.layers)
        wall = time.perf_counter() - start
        bad = [c for c in cells if c.status != "ran" or c.error or not c.edgeplug.ok]
        per_cell = statistics.mean(c.wall_seconds for c in cells)
        rows.append((executor, w, len(cells), wall, per_cell, len(bad)))
        print(f"{executor} x{w}: {len(cells)} cells in {wall:.1f} s", flush=True)
    print()
    print("| executor | workers | cells | wall s | cells / min | mean cell process s | model: ceil(N/W) x cell s | failed |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for executor, w, n, wall, per_cell, bad in rows:
        model = math.ceil(n / w) * per_cell
        print(f"| {executor} | {w} | {n} | {wall:.1f} | {60 * n / wall:.2f} | {per_cell:.1f} | {model:.1f} | {bad} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
