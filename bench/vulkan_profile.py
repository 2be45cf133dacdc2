"""Where a Vulkan program's time goes, per shader, in ExecuTorch's own runtime: edgeplug's .pte beside stock's.

ExecuTorch's Vulkan backend, built with its event tracer (``tools/vulkan-runtime/build.sh --profile``), times
every shader dispatch with GPU timestamps and logs it into an ETDump, beside its own CPU-side phases of a
delegate call (copying inputs in, executing the graph, copying outputs out). This script reads such ETDumps and
reports, per side, the GPU time of one call split by what the shaders do (matmul, attention, norm,
elementwise, data movement: staging copies, views and concatenations) and the operators that take the most.

    # here: lower small models both ways, run them in the profile runner, report
    python bench/vulkan_profile.py run --runner RUNNER [--models llama,qwen3] [--calls 5] [--json out.json]
    # ETDumps recorded elsewhere (bench/vulkan_h200.py profile, on the GPU machine): report
    python bench/vulkan_profile.py summarize DIR [--json out.json]

Timings under the query pool are not latency figures (each dispatch is followed by a timestamp write): take
latency from the plain build (bench/vulkan_runtime.py, bench/vulkan_h200.py run).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Optional

#: shader name prefix -> what it does (first match wins; names are ExecuTorch's shader variants)
CATEGORIES = (
    ("attention", r"^(sdpa|attn|compute_attn|kv_cache|update_cache|rotary|apply_rotary)"),
    ("matmul", r"^(linear|matmul|mm|bmm|addmm|conv|q8ta_linear|q4gsw|qw|dq8ca)"),
    ("norm", r"^(rms_norm|native_layer_norm|group_norm|batch_norm)"),
    ("softmax", r"^(softmax|log_softmax)"),
    ("embedding", r"^embedding"),
    ("data movement", r"^(nchw_to|image_to|buffer_to|clone|copy|view|permute|transpose|concat|cat|split|slice"
                      r"|select|expand|squeeze|unsqueeze|repeat|index|gather|pad|prepack|pack|unpack)"),
    ("elementwise", r"^(binary|unary|activation|silu|gelu|sigmoid|tanh|relu|exp|neg|abs|sqrt|rsqrt|pow|where"
                    r"|clamp|hardtanh|mul|add|sub|div|full|ones|zeros|arange|to_|cast|reduce|sum|mean|max|min)"),
)
PHASES = ("ETVK_COPY_INPUTS", "ETVK_COMPUTE_GRAPH_EXECUTE", "ETVK_COPY_OUTPUTS")


def category(kernel: str) -> str:
    for name, pattern in CATEGORIES:
        if re.match(pattern, kernel):
            return name
    return "other"


def _dispatch(event: Any) -> Optional[tuple[str, str]]:
    """(kernel, operator) of a shader dispatch event, else None. The Vulkan backend logs each dispatch with
    a JSON debug id: {"operator": {"name": "aten.linear.default", ...}, "kernel_name": ..., "dispatch_id": N}
    (no operator for the staging copies in and out)."""
    text = event.delegate_debug_id_str or event.name or ""
    if '"dispatch_id"' not in text:
        return None
    try:
        info = json.loads(text)
    except ValueError:
        return None
    kernel = str(info.get("kernel_name", "?"))
    op = (info.get("operator") or {}).get("name") or "(staging copy)"
    return kernel, str(op)


def summarize_etdump(data: bytes, calls: int) -> dict[str, Any]:
    """Per call over the last ``calls`` runs of an ETDump: GPU ms by category, the ops that take the most,
    the delegate's CPU-side phases."""
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

    dump = deserialize_from_etdump_flatcc(data)
    blocks = [b for b in dump.run_data if b.name == "Execute" and b.events]
    runs = blocks[-calls:] if calls else blocks
    if not runs:
        raise ValueError("the ETDump holds no run's events")
    by_cat: Counter = Counter()
    by_op: Counter = Counter()
    phases: Counter = Counter()
    dispatches = 0
    for block in runs:
        for ev in block.events:
            pe = ev.profile_event
            if pe is None:
                continue
            ms = (pe.end_time - pe.start_time) / 1e6
            found = _dispatch(pe)
            if found is not None:
                kernel, op = found
                by_cat[category(kernel)] += ms
                by_op[op] += ms
                dispatches += 1
            elif (pe.delegate_debug_id_str or pe.name or "") in PHASES:
                phases[pe.delegate_debug_id_str or pe.name] += ms
    n = len(runs)
    return {
        "runs": n,
        "dispatches_per_call": dispatches / n,
        "gpu_ms_per_call": sum(by_cat.values()) / n,
        "by_category_ms": {k: v / n for k, v in by_cat.most_common()},
        "top_ops_ms": {k: v / n for k, v in by_op.most_common(8)},
        "phases_ms": {k: phases[k] / n for k in PHASES if k in phases},
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    cats = [c for c, _ in CATEGORIES] + ["other"]
    lines = [
        "| model | side | dispatches / call | GPU ms / call | " + " | ".join(cats) + " | copy in / execute / copy out (CPU ms) |",
        "| --- | --- | --- | --- | " + " | ".join("---" for _ in cats) + " | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['side']} | not run: {r['error']} |" + " |" * (len(cats) + 2))
            continue
        p = r["phases_ms"]
        lines.append(
            f"| {r['model']} | {r['side']} | {r['dispatches_per_call']:.0f} | {r['gpu_ms_per_call']:.2f} | "
            + " | ".join(f"{r['by_category_ms'].get(c, 0.0):.2f}" for c in cats)
            + f" | {p.get(PHASES[0], 0):.2f} / {p.get(PHASES[1], 0):.2f} / {p.get(PHASES[2], 0):.2f} |"
        )
    return "\n".join(lines)


def record(session: Any, inputs: list, calls: int, warmup: int, path: Path) -> None:
    """Run ``warmup`` + ``calls`` times in a profile runner's session, then write its ETDump to ``path``."""
    for _ in range(warmup + calls):
        session.run(inputs)
    session.etdump(path)


def _run(a: argparse.Namespace) -> int:
    import torch

    import edgeplug
    from edgeplug._zoo._cell import _quiet
    from edgeplug._zoo._models import load_entry
    from edgeplug_vulkan_delegate.runtime import RunnerSession, _build_of

    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.dialects._ops import ops as exir_ops

    _quiet()
    build = _build_of(Path(a.runner))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for key in [m for m in a.models.split(",") if m]:
            model, args, kwargs = load_entry(key, layers=a.layers)
            ptes = {"edgeplug": edgeplug.lower(model, args, "vulkan", kwargs=kwargs).buffer}
            with torch.no_grad():
                stock = to_edge_transform_and_lower(
                    torch.export.export(model, args, kwargs),
                    # the two ops the runtime has no kernel for, blocked as a stock user does once it refuses them
                    partitioner=[VulkanPartitioner(operator_blocklist=[
                        exir_ops.edge.aten.logical_not.default, exir_ops.edge.aten.eq.Tensor, exir_ops.edge.aten.eq.Scalar])],
                )
            ptes["stock-blocked"] = stock.to_executorch().buffer
            flat = [*args, *kwargs.values()]
            for side, pte in ptes.items():
                path = Path(tmp) / f"{key}-{side}.etdump"
                try:
                    with RunnerSession(pte, build=build) as s:
                        if not s.profiling:
                            raise SystemExit(f"{a.runner} was built without the event tracer: build.sh --profile")
                        record(s, flat, a.calls, a.warmup, path)
                    rows.append({"model": key, "side": side, **summarize_etdump(path.read_bytes(), a.calls)})
                except SystemExit:
                    raise
                except Exception as exc:
                    rows.append({"model": key, "side": side, "error": str(exc).splitlines()[0][:300]})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return _report(rows, a.json, f"{build.name} (event tracer build)")


def _summarize(a: argparse.Namespace) -> int:
    rows = []
    meta = {}
    folder = Path(a.dir)
    if (folder / "profile.json").is_file():
        meta = json.loads((folder / "profile.json").read_text())
    for path in sorted(folder.glob("*.etdump")):
        model, _, side = path.stem.rpartition("-")
        if side == "blocked":  # "<model>-stock-blocked"
            model, _, side = model.rpartition("-")
            side += "-blocked"
        rows.append({"model": model, "side": side, **summarize_etdump(path.read_bytes(), meta.get("calls", a.calls))})
    for key, why in meta.get("errors", {}).items():
        model, _, side = key.partition(":")
        rows.append({"model": model, "side": side, "error": why})
    return _report(rows, a.json, meta.get("runtime", "ExecuTorch Vulkan runtime"), meta.get("adapter", ""))


def _report(rows: list[dict], json_path: str, runtime: str, adapter: str = "") -> int:
    print(f"runtime: {runtime}{' on ' + adapter if adapter else ''}; GPU ms per call by what the shaders do\n")
    print(markdown(rows))
    top = defaultdict(dict)
    for r in rows:
        if "top_ops_ms" in r:
            top[r["model"]][r["side"]] = r["top_ops_ms"]
    for model, sides in top.items():
        for side, kernels in sides.items():
            print(f"\n{model} / {side}: " + ", ".join(f"{k} {v:.2f}" for k, v in list(kernels.items())[:5]))
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--runner", required=True, help="edgeplug-vulkan-runner of a build.sh --profile build")
    r.add_argument("--models", default="llama,qwen3")
    r.add_argument("--layers", type=int, default=2)
    r.add_argument("--calls", type=int, default=5)
    r.add_argument("--warmup", type=int, default=2)
    r.add_argument("--json", default="")
    s = sub.add_parser("summarize")
    s.add_argument("dir")
    s.add_argument("--calls", type=int, default=5)
    s.add_argument("--json", default="")
    a = p.parse_args(argv)
    return _run(a) if a.cmd == "run" else _summarize(a)


if __name__ == "__main__":
    sys.exit(main())
