"""optimum-executorch's quantized KV-cache program on vulkan: edgeplug beside stock ExecuTorch, run in
ExecuTorch's own Vulkan runtime and on edgeplug's host emulation, over decode steps and greedy tokens.

For each model a tiny random decoder is quantized by optimum-executorch's own recipe
(``quantize_model_``: linear 8da4w group 32, embedding 8w or 4w) and exported by its
``CausalLMExportableModule`` (static KV cache, dynamic length); that one program is lowered

- by edgeplug (``edgeplug.lower(ep, kwargs=..., backend="vulkan")``), then verified by
  ``edgeplug.verify(..., verify_steps=N)`` twice: in ExecuTorch's Vulkan runtime (the runner
  ``tools/vulkan-runtime/build.sh`` builds) and on the host emulation (``EDGEPLUG_VULKAN_RUNNER=off``):
  prefill + 3 decode steps against the quantized model from the same state, max |difference| per call,
  and N greedy ids against the quantized model's (the first differing step and its margin where they part);
- by stock ExecuTorch (``to_edge_transform_and_lower`` with ``VulkanPartitioner``), its ``.pte`` loaded in
  the same runtime, or the error that stops it (lowering or load), in the runtime's words.

    python bench/vulkan_quantized.py [--models llama,qwen3,mistral] [--layers 2] [--hidden 64]
                                     [--qembedding 8w] [--greedy 32] [--json out.json]

Needs optimum-executorch and a built runner (``EDGEPLUG_VULKAN_RUNNER`` or the build cache;
docs/vulkan-runtime.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from typing import Any, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import edgeplug  # noqa: E402
from edgeplug._failures import first_line  # noqa: E402

PROMPT = 16


def quantized_program(arch: str, layers: int, hidden: int, max_len: int, vocab: int, qembedding: str) -> Any:
    from deploy import build, exportable
    from optimum.exporters.executorch.quantization import quantize_model_

    model = build(arch, layers, hidden, max_len, vocab)
    quantize_model_(model, qlinear_config="8da4w", qlinear_group_size=32, qembedding_config=qembedding,
                    qembedding_group_size=0 if qembedding == "8w" else 32)
    return exportable(model, max_len).export()["model"]


def stock(ep: Any, kwargs: dict, runtime: Any) -> dict[str, Any]:
    """Stock ExecuTorch's Vulkan lowering of ``ep``: counts, and whether its .pte loads and runs the prefill."""
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from edgeplug._inputs import ExampleInputs, runtime_inputs
    from edgeplug._zoo._lowering import stock_graph_breaks
    from edgeplug_vulkan_delegate.runtime import RunnerSession

    class Counting(VulkanPartitioner):
        """Stock's partitioner, its partition counted as it answers (the lowering may fail after it)."""

        def partition(self, program: Any) -> Any:
            import operator

            answer = super().partition(program)
            tags = {n.meta.get("delegation_tag") for n in program.graph.nodes if n.meta.get("delegation_tag")}
            cpu = [n for n in program.graph.nodes if n.op == "call_function" and n.target is not operator.getitem
                   and not n.meta.get("delegation_tag")]
            out.update(partitions=len(tags), cpu_nodes=len(cpu))
            return answer

    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        edge = to_edge_transform_and_lower(copy.deepcopy(ep), partitioner=[Counting()])
        parts, cpu = stock_graph_breaks(edge.exported_program())
        out.update(partitions=parts, cpu_nodes=sum(cpu.values()))
        buffer = edge.to_executorch().buffer
    except Exception as exc:
        out.update(lowers=False, error=f"lowering fails: {first_line(exc)}", seconds=time.perf_counter() - t0)
        return out
    out.update(lowers=True, seconds=time.perf_counter() - t0, pte_bytes=len(buffer))
    try:
        with RunnerSession(buffer, build=runtime.build) as session:
            session.run(runtime_inputs(ep, ExampleInputs((), kwargs)))
        out["loads"] = True
    except Exception as exc:
        out.update(loads=False, error=f"does not load: {first_line(exc)}")
    return out


def edgeplug_side(ep: Any, kwargs: dict, greedy: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    result = edgeplug.lower(ep, kwargs=kwargs, backend="vulkan")
    report = result.report
    out: dict[str, Any] = {
        "partitions": len(report.partitions), "cpu_nodes": report.cpu_node_count, "cpu_ops": dict(report.cpu_ops),
        "seconds": time.perf_counter() - t0, "pte_bytes": len(result.buffer),
    }
    for where, variable in (("real", None), ("emulation", "off")):
        saved = os.environ.get("EDGEPLUG_VULKAN_RUNNER")
        if variable:
            os.environ["EDGEPLUG_VULKAN_RUNNER"] = variable
        try:
            v = edgeplug.verify(result, "vulkan", verify_steps=greedy)
        except Exception as exc:
            out[where] = {"error": first_line(exc)}
            continue
        finally:
            if variable:
                if saved is None:
                    os.environ.pop("EDGEPLUG_VULKAN_RUNNER", None)
                else:
                    os.environ["EDGEPLUG_VULKAN_RUNNER"] = saved
        g = v.greedy
        out[where] = {
            "method": v.method, "adapter": v.adapter, "passed": v.passed,
            "per_call": {o.label: o.max_abs_diff for o in v.outputs}, "tolerance": [o.tolerance for o in v.outputs],
            "greedy": g.summary(), "greedy_passed": g.passed, "first_difference": g.first_difference,
            "margin": g.margin, "lowered_ids": g.lowered_ids, "reference_ids": g.reference_ids, "runner": g.runner,
        }
    return out


def _diffs(side: dict) -> str:
    return " / ".join(f"{x:.1e}" for x in side["per_call"].values()) if "per_call" in side else side.get("error", "—")


def _greedy(side: dict, n: int) -> str:
    if "lowered_ids" not in side:
        return "—"
    if side["first_difference"] is None:
        return f"{n} / {n} agree"
    k = side["first_difference"]
    verdict = "near-tie" if side["greedy_passed"] else "FAILED"
    return f"first {k} / {n} agree; step {k}: margin {side['margin']:.3g} ({verdict})"


def markdown(rows: list[dict[str, Any]], n: int) -> str:
    lines = [
        "| model | side | partitions / CPU nodes | .pte in ExecuTorch's Vulkan runtime | max abs diff per call (prefill, decode 1-3) | greedy ids vs the quantized model |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        e, s = r["edgeplug"], r["stock"]
        real, emu = e.get("real", {}), e.get("emulation", {})
        loads = "loads, runs" if "per_call" in real else real.get("error", "—")
        lines.append(f"| {r['model']} | edgeplug | {e['partitions']} / {e['cpu_nodes']} | {loads} | {_diffs(real)} | {_greedy(real, n)} |")
        lines.append(f"| | edgeplug, host emulation | | | {_diffs(emu)} | {_greedy(emu, n)} |")
        counts = f"{s['partitions']} / {s['cpu_nodes']}" if "partitions" in s else "—"
        lines.append(f"| | stock VulkanPartitioner | {counts} | {'loads' if s.get('loads') else s.get('error', '—')} | | |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="llama,qwen3,mistral")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--qembedding", default="8w", choices=("8w", "4w"))
    p.add_argument("--greedy", type=int, default=32, help="greedy tokens compared (verify_steps)")
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    from edgeplug._verify.targets import find_device_runtime
    from edgeplug._zoo._cell import _quiet

    runtime, why = find_device_runtime(edgeplug.get_backend("vulkan"))
    if runtime is None:
        raise SystemExit(f"vulkan_quantized.py: {why}")
    _quiet()  # executorch's partitioners log every node at INFO
    rows = []
    max_len = PROMPT + a.greedy + 16
    for arch in [m for m in a.models.split(",") if m]:
        t0 = time.perf_counter()
        ep = quantized_program(arch, a.layers, a.hidden, max_len, a.vocab, a.qembedding)
        kwargs = {"input_ids": torch.randint(0, a.vocab, (1, PROMPT), generator=torch.Generator().manual_seed(1)),
                  "cache_position": torch.arange(PROMPT)}
        row = {"model": f"{arch} {a.layers} x {a.hidden}, 8da4w/{a.qembedding}", "edgeplug": edgeplug_side(ep, kwargs, a.greedy),
               "stock": stock(ep, kwargs, runtime)}
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
        print(f"{row['model']}: {row['seconds']:.0f} s; edgeplug real {_diffs(row['edgeplug'].get('real', {}))}, "
              f"{row['edgeplug'].get('real', {}).get('greedy', '')}; stock {row['stock'].get('error', 'loads')}",
              file=sys.stderr, flush=True)
    print(f"runtime: {runtime.name}; adapter: {rows[0]['edgeplug'].get('real', {}).get('adapter', '?') if rows else '?'}")
    print(markdown(rows, a.greedy))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
