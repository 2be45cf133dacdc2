"""What the core's graph safety costs, against executorch's own to_edge.

On a 32-layer decoder (``edgeplug.examples.llama.tiny_llama(layers=32)``):

- runner overhead: ``run_passes`` over a backend's export-stage passes minus
  calling the same pass functions directly (name reservation, lint of every
  graph module, signature check, recompile after each pass);
- analysis: ``analyze_constants`` (constant_only_nodes + weight sources) on
  the aten and the edge program, and ``resolve_scalar`` over every scalar
  operand of the edge program;
- folding: every Gemma ``1 + w`` of a 32-layer Gemma-style decoder folded
  into a lifted constant with ``fold_constants``;

each as a fraction of ``to_edge`` on the same model. Also the analysis at 8,
16 and 32 layers, to show it grows linearly. Medians of ``--repeat`` runs
(``--edge-repeat`` for to_edge, which is slow; folding runs once).

    python bench/graph_overhead.py [--layers 32] [--repeat 5] [--edge-repeat 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import time
import warnings
from typing import Any, Callable

import torch


def _median(fn: Callable[[], Any], repeat: int, setup: Callable[[], Any] | None = None) -> float:
    times = []
    for _ in range(repeat):
        arg = setup() if setup is not None else None
        t = time.perf_counter()
        fn(arg) if setup is not None else fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _export(layers: int, gemma: bool = False):
    from edgeplug.examples.llama import TinyDecoder, _init, tiny_llama

    if gemma:
        model = TinyDecoder(layers=layers, gemma=True)
        model._gemma = True
        _init(model, seed=2)
        inputs = (torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(3)),)
    else:
        model, inputs = tiny_llama(layers=layers)
    return torch.export.export(model, inputs)


def _to_edge(ep):
    from executorch.exir import EdgeCompileConfig, to_edge

    return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--edge-repeat", type=int, default=1, help="runs of to_edge (slow) to take the median of")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)

    import edgeplug
    from edgeplug._graph import analyze_constants, fold_constants, reserve_node_names, resolve_scalar, run_passes
    from edgeplug._graph.passes import check_program

    L, R = args.layers, args.repeat
    ep = _export(L)
    nodes = len(ep.graph.nodes)

    # executorch's to_edge on the same program (the reference)
    to_edge_s = _median(lambda: _to_edge(_export(L)), args.edge_repeat)
    edge_ep = _to_edge(_export(L)).exported_program()

    # runner overhead: the backends' real export-stage passes, direct vs through the runner
    passes = [p for b in ("qnn", "samsung") for p in edgeplug.get_backend(b).passes_for("export")]

    def direct(e):
        for p in passes:
            out = p.fn(e)
            e = out if out is not None else e

    direct_s = _median(direct, R, setup=lambda: _export(L))
    runner_s = _median(lambda e: run_passes(e, passes).program, R, setup=lambda: _export(L))
    reserve_s = _median(reserve_node_names, R, setup=lambda: _export(L))
    check_s = _median(lambda: check_program(ep), R)
    recompile_s = _median(lambda: ep.graph_module.recompile(), R)

    # analysis
    aten_analysis_s = _median(lambda: analyze_constants(ep), R)
    edge_analysis_s = _median(lambda: analyze_constants(edge_ep), R)
    scalar_args = [
        a for n in edge_ep.graph.nodes if n.op == "call_function" for a in n.args if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor) and a.meta["val"].dim() == 0
    ]
    scalars_s = _median(lambda: [resolve_scalar(a, edge_ep) for a in scalar_args], R)
    scaling = {}
    for layers in sorted({8, 16, L}):
        e = _export(layers)
        scaling[layers] = {"nodes": len(e.graph.nodes), "analysis_ms": 1e3 * _median(lambda: analyze_constants(e), R)}

    # folding every 1 + w of a Gemma-style decoder (edge dialect)
    def fold_all(e):
        a = analyze_constants(e)
        targets = [n for n in e.graph.nodes if n.op == "call_function" and a.source(n) == "computed" and "add" in str(n.target) and n.users]
        fold_constants(e, targets, name_hint="norm_weight")
        return len(targets)

    gemma = _to_edge(_export(L, gemma=True)).exported_program()
    t = time.perf_counter()
    gemma_count = fold_all(gemma)
    fold_s = time.perf_counter() - t

    overhead_s = max(runner_s - direct_s, 0.0)
    figures = {
        "model": f"tiny_llama(layers={L})",
        "aten_nodes": nodes,
        "edge_nodes": len(edge_ep.graph.nodes),
        "to_edge_s": to_edge_s,
        "passes": [p.name for p in passes],
        "passes_direct_s": direct_s,
        "passes_runner_s": runner_s,
        "runner_overhead_s": overhead_s,
        "runner_overhead_per_pass_ms": 1e3 * overhead_s / len(passes),
        "runner_overhead_vs_to_edge": overhead_s / to_edge_s,
        "reserve_node_names_ms": 1e3 * reserve_s,
        "check_program_ms": 1e3 * check_s,
        "recompile_ms": 1e3 * recompile_s,
        "analysis_aten_ms": 1e3 * aten_analysis_s,
        "analysis_edge_ms": 1e3 * edge_analysis_s,
        "analysis_vs_to_edge": edge_analysis_s / to_edge_s,
        "resolve_scalar_operands": len(scalar_args),
        "resolve_scalar_all_ms": 1e3 * scalars_s,
        "fold_gemma_weights": gemma_count,
        "fold_all_s": fold_s,
        "fold_all_vs_to_edge": fold_s / to_edge_s,
        "analysis_scaling": scaling,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
    }
    print(f"model: {figures['model']}  aten nodes {nodes}, edge nodes {figures['edge_nodes']}")
    print(f"to_edge (executorch)                  {to_edge_s:8.3f} s")
    print(f"export passes direct ({len(passes)} passes)       {direct_s * 1e3:8.1f} ms")
    print(f"export passes through run_passes      {runner_s * 1e3:8.1f} ms")
    print(f"runner overhead                       {overhead_s * 1e3:8.1f} ms  ({100 * overhead_s / to_edge_s:.2f}% of to_edge; {figures['runner_overhead_per_pass_ms']:.1f} ms/pass)")
    print(f"  reserve_node_names / check / recompile {reserve_s * 1e3:.1f} / {check_s * 1e3:.1f} / {recompile_s * 1e3:.1f} ms")
    print(f"constant analysis, aten / edge        {aten_analysis_s * 1e3:8.1f} / {edge_analysis_s * 1e3:.1f} ms  ({100 * edge_analysis_s / to_edge_s:.2f}% of to_edge)")
    print(f"resolve_scalar x{len(scalar_args):<5d}                  {scalars_s * 1e3:8.1f} ms")
    print(f"fold_constants x{gemma_count} (Gemma 1 + w)      {fold_s:8.3f} s  ({100 * fold_s / to_edge_s:.1f}% of to_edge)")
    print("analysis scaling: " + ", ".join(f"{k} layers {v['nodes']} nodes {v['analysis_ms']:.1f} ms" for k, v in scaling.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
