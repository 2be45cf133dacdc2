"""What ``edgeplug.fuse`` costs, against executorch's own to_edge.

Two 32-layer decoders from ``edgeplug.examples.llama`` (65 RMSNorms each):

- Llama-style (``tiny_llama``): every norm weight is a parameter, fused as it is;
- Gemma-style (``TinyDecoder(gemma=True)``, initialised as ``gemma_style_block``):
  every weight is ``1 + w``, folded into a new constant at AOT.

For each: ``to_edge`` of the exported program (export not included), then
``edgeplug.fuse`` on ``to_edge(...).exported_program()``, its time as a
fraction of to_edge, and how many times it recompiled the graph module
(counted by wrapping ``torch.fx.GraphModule.recompile``). Medians of
``--repeat`` runs (``--edge-repeat`` for to_edge, which is slow).

    python bench/fusion_overhead.py [--layers 32] [--backend vulkan] [--repeat 3] [--edge-repeat 1] [--json out.json]
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


def _median(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _model(layers: int, gemma: bool):
    from edgeplug.examples.llama import TinyDecoder, _init, tiny_llama

    if not gemma:
        return tiny_llama(layers=layers)
    model = TinyDecoder(layers=layers, gemma=True)
    model._gemma = True  # what gemma_style_block does: norm weights near 0, used as 1 + w
    _init(model, seed=2)
    return model, (torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(3)),)


class _RecompileCounter:
    def __init__(self) -> None:
        self.count = 0
        self._real = torch.fx.GraphModule.recompile

    def __enter__(self) -> "_RecompileCounter":
        real = self._real

        def counted(gm: Any, *a: Any, **k: Any) -> Any:
            self.count += 1
            return real(gm, *a, **k)

        torch.fx.GraphModule.recompile = counted
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.fx.GraphModule.recompile = self._real


def measure(layers: int, gemma: bool, backend: str, repeat: int, edge_repeat: int) -> dict[str, Any]:
    import edgeplug
    from executorch.exir import to_edge

    model, inputs = _model(layers, gemma)
    exported = torch.export.export(model, inputs)
    to_edge_s = _median(lambda: to_edge(exported), edge_repeat)
    ep = to_edge(exported).exported_program()
    with _RecompileCounter() as recompiles:
        _, records = edgeplug.fuse(ep, backend)
    fuse_s = _median(lambda: edgeplug.fuse(ep, backend), repeat)
    outcomes: dict[str, int] = {}
    for r in records:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    return {
        "model": f"TinyDecoder(layers={layers}, gemma={gemma})",
        "edge_nodes": len(ep.graph.nodes),
        "to_edge_s": to_edge_s,
        "fuse_s": fuse_s,
        "fuse_vs_to_edge": fuse_s / to_edge_s,
        "recompiles": recompiles.count,
        "outcomes": outcomes,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--backend", default="vulkan", help="a backend whose rms_norm policy folds computed weights")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--edge-repeat", type=int, default=1, help="runs of to_edge (slow) to take the median of")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)

    figures: dict[str, Any] = {
        "backend": args.backend,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
    }
    for style, gemma in (("llama", False), ("gemma", True)):
        f = measure(args.layers, gemma, args.backend, args.repeat, args.edge_repeat)
        figures[style] = f
        print(
            f"{style}-style {args.layers} layers ({f['edge_nodes']} edge nodes): to_edge {f['to_edge_s']:.2f} s, "
            f"fuse ({args.backend}) {f['fuse_s']:.3f} s = {100 * f['fuse_vs_to_edge']:.1f}% of to_edge, "
            f"{f['recompiles']} recompiles, {f['outcomes']}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2)


if __name__ == "__main__":
    main()
