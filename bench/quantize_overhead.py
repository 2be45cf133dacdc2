"""What quantizing costs, against the float lowering of the same model, per backend.

Model: ``tiny_llama(layers=32)`` from ``edgeplug.examples.llama`` (a 32-layer
Llama-style decoder, 65 RMSNorms). For each backend and its scheme:

- float: ``edgeplug.lower(model, inputs, backend)`` (export included);
- quantize: ``edgeplug.quantize(model, inputs, backend, scheme)`` (export,
  norms recomposed, prepare, calibrate on the example inputs, convert);
- quantized lowering: ``edgeplug.lower(quantized, inputs, backend)``;

each as wall seconds and as a ratio to the float lowering (and the process's
CPU seconds, the fairer measure on a shared machine), after a one-layer
warm-up of both paths (imports and first calls excluded), one run each (a
32-layer lowering takes minutes). A backend that cannot
serialize here (qnn and samsung without their SDKs) is lowered as a dry run,
float and quantized alike. Partitions and CPU nodes are given beside each.

    python bench/quantize_overhead.py [--layers 32] [--backends qnn,samsung,xnnpack,vulkan,webgpu] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import time
import warnings
from typing import Any

import torch

#: the scheme measured per backend (each backend's first; 8-bit weights)
SCHEMES = {"qnn": "8a8w", "samsung": "a8w8", "xnnpack": "8a8w", "vulkan": "w8", "webgpu": "w8"}


#: CPU seconds of this process per measured call, beside the wall times (on a shared machine
#: the wall clock also counts the time other processes held the CPU)
CPU: dict[str, float] = {}


def _timed(fn, label: str = "") -> tuple[Any, float]:
    t, c = time.perf_counter(), time.process_time()
    value = fn()
    if label:
        CPU[label] = time.process_time() - c
    return value, time.perf_counter() - t


def measure(backend: str, layers: int) -> dict[str, Any]:
    import edgeplug
    from edgeplug.examples.llama import tiny_llama

    dry_run = not edgeplug.get_backend(backend).availability().ok
    scheme = SCHEMES[backend]
    # warm-up on one layer: imports and first-call costs are not the model's
    small, small_inputs = tiny_llama(layers=1)
    edgeplug.lower(edgeplug.quantize(small, small_inputs, backend, scheme), small_inputs, backend, dry_run=dry_run)
    edgeplug.lower(small, small_inputs, backend, dry_run=dry_run)
    model, inputs = tiny_llama(layers=layers)
    flt, float_s = _timed(lambda: edgeplug.lower(model, inputs, backend, dry_run=dry_run), "float_lower")
    quantized, quantize_s = _timed(lambda: edgeplug.quantize(model, inputs, backend, scheme), "quantize")
    qnt, lower_q_s = _timed(lambda: edgeplug.lower(quantized, inputs, backend, dry_run=dry_run), "quantized_lower")
    q_stages = {s.stage: round(s.seconds, 2) for s in qnt.report.stages if s.stage.startswith("quantize: ")}
    return {
        "backend": backend,
        "scheme": scheme,
        "dry_run": dry_run,
        "float_lower_s": float_s,
        "quantize_s": quantize_s,
        "quantized_lower_s": lower_q_s,
        "quantize_vs_float": quantize_s / float_s,
        "quantized_lower_vs_float": lower_q_s / float_s,
        "total_vs_float": (quantize_s + lower_q_s) / float_s,
        "cpu_s": dict(CPU),
        "cpu_quantize_vs_float": CPU["quantize"] / CPU["float_lower"],
        "cpu_quantized_lower_vs_float": CPU["quantized_lower"] / CPU["float_lower"],
        "quantize_stages": q_stages,
        "norms_recomposed": len(qnt.report.quantization.norms),
        "float_partitions": len(flt.report.partitions),
        "float_cpu_nodes": flt.report.cpu_node_count,
        "quantized_partitions": len(qnt.report.partitions),
        "quantized_cpu_nodes": qnt.report.cpu_node_count,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--backends", default=",".join(SCHEMES))
    ap.add_argument("--json", help="also write the figures here (rewritten after each backend)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    figures: dict[str, Any] = {
        "layers": args.layers,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "backends": [],
    }
    for backend in args.backends.split(","):
        f = measure(backend.strip(), args.layers)
        figures["backends"].append(f)
        mode = " (dry run)" if f["dry_run"] else ""
        print(
            f"{backend} {f['scheme']}{mode}: float lower {f['float_lower_s']:.1f} s; quantize {f['quantize_s']:.1f} s "
            f"(x{f['quantize_vs_float']:.2f}), quantized lower {f['quantized_lower_s']:.1f} s "
            f"(x{f['quantized_lower_vs_float']:.2f}); together x{f['total_vs_float']:.2f}; partitions "
            f"{f['float_partitions']} -> {f['quantized_partitions']}, CPU nodes {f['float_cpu_nodes']} -> "
            f"{f['quantized_cpu_nodes']}; CPU time: quantize x{f['cpu_quantize_vs_float']:.2f}, quantized lower "
            f"x{f['cpu_quantized_lower_vs_float']:.2f}",
            flush=True,
        )
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(figures, fh, indent=2)


if __name__ == "__main__":
    main()
