"""ExecuTorch's own Llama with its custom attention and cache ops, beside the same Llama without them.

The model is ``executorch.examples.models.llama``'s ``Transformer`` (randomly initialised, nothing is
downloaded) with a KV cache, exported with a dynamic sequence length and called as ExecuTorch's Llama
runner calls it, ``forward(tokens, {"input_pos": pos})``. Two programs of the same weights:

- **plain**: the model as built (``Attention`` writes its ``KVCache`` with ``index_put``, ``SDPA``
  decomposes into matmuls and a softmax over the whole cache);
- **custom ops**: the two source transforms ExecuTorch's ``export_llama --use_sdpa_with_kv_cache``
  applies, ``replace_sdpa_with_custom_op`` then ``replace_kv_cache_with_custom_kv_cache``: attention is
  ``llama::custom_sdpa`` (causal, over the positions up to ``input_pos`` only) and the cache writes are
  ``llama::update_cache``, both kernels of ``executorch.extension.llm.custom_ops`` that run on the CPU.

Lowerings, each to an XNNPACK ``.pte``: edgeplug's of both programs (``--verify`` with
``verify_steps``: greedy tokens through the ``.pte`` against eager), and stock ExecuTorch's
(``to_edge_transform_and_lower`` with ``XnnpackPartitioner``, what ``export_llama`` runs) of the
custom-op program. All run in executorch's runtime in one process, sides alternating (``bench/deploy.py``'s
timing): prefill of the prompt, single-token decode steps, and the decode curve at cache positions.
With ``--quantize 8da4w`` both programs are quantized first with optimum-executorch's recipe (linear
8da4w group 32, embedding 8w; ``bench/deploy.py``'s ``quantize_as_optimum``).

    python bench/custom_ops.py [--layers 4] [--dim 512] [--prompt 16] [--decode 16] [--rounds 5]
                               [--curve 16,256,1024] [--quantize 8da4w] [--greedy 32] [--profile] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from dataclasses import asdict
from typing import Any, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy  # noqa: E402  the sides, timing and the decode curve


def build(layers: int, dim: int, vocab: int, max_len: int) -> torch.nn.Module:
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    heads = max(dim // 64, 2)
    torch.manual_seed(0)
    args = ModelArgs(
        dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=max(heads // 2, 1), hidden_dim=2 * dim,
        vocab_size=vocab, max_seq_len=max_len, max_context_len=max_len, use_kv_cache=True,
    )
    return construct_transformer(args).eval()


def with_custom_ops(model: torch.nn.Module) -> torch.nn.Module:
    """ExecuTorch's ``--use_sdpa_with_kv_cache`` transforms, on a copy sharing nothing with ``model``."""
    from executorch.examples.models.llama.source_transformation.custom_kv_cache import (
        replace_kv_cache_with_custom_kv_cache,
    )
    from executorch.examples.models.llama.source_transformation.sdpa import replace_sdpa_with_custom_op

    return replace_kv_cache_with_custom_kv_cache(replace_sdpa_with_custom_op(copy.deepcopy(model)))


def export(model: torch.nn.Module, prompt: torch.Tensor, max_len: int) -> torch.export.ExportedProgram:
    seq = torch.export.Dim("seq", min=1, max=max_len - 1)
    inputs = (prompt, {"input_pos": torch.arange(prompt.shape[1])})
    with torch.no_grad():
        return torch.export.export(model, inputs, dynamic_shapes=({1: seq}, {"input_pos": {0: seq}}), strict=False)


def edgeplug_side(ep: Any, prompt: torch.Tensor, greedy: int) -> tuple[deploy.Side, str]:
    import edgeplug

    side = deploy.Side()
    try:
        started = time.perf_counter()
        result = edgeplug.lower(ep, (prompt, {"input_pos": torch.arange(prompt.shape[1])}), backend="xnnpack")
        side.lowering_s = time.perf_counter() - started
    except Exception as exc:
        side.error = deploy.cell_error(exc)
        return side, ""
    report = result.report
    side.partitions, side.cpu_ops, side.cpu_nodes = len(report.partitions), dict(report.cpu_ops), report.cpu_node_count
    side.lowers, side.buffer, side.pte_bytes = True, result.buffer, len(result.buffer)
    checked = ""
    if greedy:
        v = edgeplug.verify(result, "xnnpack", verify_steps=greedy)
        checked = f"{'passed' if v.passed else 'FAILED'}: {v.greedy.summary()}"
        if v.failures():
            checked += " | " + "; ".join(v.failures())
    return side, checked


def stock_side(ep: Any) -> deploy.Side:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    side = deploy.Side()
    try:
        started = time.perf_counter()
        edge = to_edge_transform_and_lower(copy.deepcopy(ep), partitioner=[XnnpackPartitioner()])
        side.partitions, cpu = deploy.stock_graph_breaks(edge.exported_program())
        side.buffer = edge.to_executorch().buffer
        side.lowering_s = time.perf_counter() - started
    except Exception as exc:
        side.error = deploy.cell_error(exc)
        return side
    side.cpu_ops, side.cpu_nodes = dict(cpu), sum(cpu.values())
    side.lowers, side.pte_bytes = True, len(side.buffer)
    return side


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--decode", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--curve", default="16,256,1024")
    p.add_argument("--greedy", type=int, default=32, help="tokens edgeplug's verify_steps checks (0: none)")
    p.add_argument("--quantize", choices=["8da4w"], default=None)
    p.add_argument("--profile", action="store_true", help="also split a decode step per program with ETDump")
    p.add_argument("--json")
    args = p.parse_args(argv)
    positions = [int(n) for n in args.curve.split(",") if n]
    max_len = max([args.prompt + max(args.decode, args.greedy), *(q + 8 for q in positions)]) + 8
    deploy._quiet()
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  registers llama::custom_sdpa, update_cache

    plain = build(args.layers, args.dim, args.vocab, max_len)
    custom = with_custom_ops(plain)
    if args.quantize:
        for m in (plain, custom):
            deploy.quantize_as_optimum(m, args.quantize)
    torch.manual_seed(1)
    prompt = torch.randint(0, args.vocab, (1, args.prompt))
    sides: dict[str, deploy.Side] = {}
    checks: dict[str, str] = {}
    for name, model in (("plain (edgeplug)", plain), ("custom ops (edgeplug)", custom)):
        sides[name], checks[name] = edgeplug_side(export(model, prompt, max_len), prompt, args.greedy)
        print(f"{name}: lowered", file=sys.stderr, flush=True)
    sides["custom ops (stock)"] = stock_side(export(custom, prompt, max_len))
    running = [s for s in sides.values() if s.lowers]
    deploy.timing(running, prompt, args.decode, args.rounds, args.threads)
    if positions:
        deploy.curve(running, positions, args.rounds, args.threads)
    if args.profile:
        deploy.profile(running, prompt, args.decode, args.rounds, args.threads)
    t = str(args.threads)
    base = sides["plain (edgeplug)"]
    lines = [
        f"| program ({args.layers} x {args.dim}, {args.quantize or 'fp32'}, cache {max_len}) | partitions / CPU nodes "
        f"| .pte MiB | lowering s | prefill {args.prompt} ms ({t}t) | decode ms/token ({t}t) | "
        + " | ".join(f"decode ms at {q}" for q in positions) + " |",
        "| --- " * (6 + len(positions)) + "|",
    ]
    for name, s in sides.items():
        if not s.lowers:
            lines.append(f"| {name} | fails: {s.error} |")
            continue

        def vs(a: float, b: float) -> str:
            return "" if s is base or not b else f" ({a / b:.2f}x)"

        cells = [name, f"{s.partitions} / {s.cpu_nodes}", f"{s.pte_bytes / 2**20:.1f}", f"{s.lowering_s:.1f}",
                 f"{s.prefill_ms[t]:.2f}{vs(s.prefill_ms[t], base.prefill_ms.get(t, 0))}",
                 f"{s.decode_ms[t]:.2f}{vs(s.decode_ms[t], base.decode_ms.get(t, 0))}"]
        cells += [f"{s.curve_ms[str(q)]:.2f}{vs(s.curve_ms[str(q)], base.curve_ms.get(str(q), 0))}" for q in positions]
        lines.append("| " + " | ".join(cells) + " |")
    print("\n".join(lines))
    print()
    for name, s in sides.items():
        if s.lowers:
            top = ", ".join(f"{op} x{n}" for op, n in sorted(s.cpu_ops.items(), key=lambda kv: -kv[1])[:8])
            print(f"{name}: CPU ops: {top}")
    for name, s in sides.items():
        prof = s.decode_profile.get(t)
        if prof:
            shares = ", ".join(f"{k} {prof.get(k, 0.0):.3f}" for k in (
                "Method::execute", "xnn fully connected", "xnn other", "delegate overhead", "OPERATOR_CALL"))
            ops = sorted(((v, k) for k, v in prof.items() if k.startswith(("cpu ", "xnn op "))), reverse=True)[:6]
            print(f"{name}: best decode step ms (ETDump): {shares}; largest: "
                  + ", ".join(f"{k} {v:.3f}" for v, k in ops))
    for name, text in checks.items():
        if text:
            print(f"{name}: verify_steps={args.greedy}: {text}")
    if args.json:
        rows = {k: {**asdict(v), "buffer": None} for k, v in sides.items()}
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "sides": rows, "checks": checks}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
