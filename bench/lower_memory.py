"""Peak memory and time of one lowering per process: edgeplug beside stock ExecuTorch (issue 27).

Each cell is one process (``--cell``): it builds a transformers Llama with random
weights, notes its resident size (libraries and the model loaded: the model's
own footprint), lowers once and writes the ``.pte`` (and ``.ptd``), and prints
one JSON line. Growth is the peak resident size above that footprint, also as a
multiple of the parameter bytes; per-stage peaks come from ``edgeplug._memory``
(Linux's resident high-water mark, reset at each stage).

    python bench/lower_memory.py                       # the default grid, xnnpack and vulkan
    python bench/lower_memory.py --models 4x512 8x1024 --backends xnnpack
    python bench/lower_memory.py --models 28x3072 --dtype fp16 --seq 64 --backends xnnpack \\
        --external-weights --sides edgeplug stock --rss-cap-gb 20 --timeout 3000   # the 3B case

Stock is executorch's own flow: ``torch.export`` -> ``to_edge_transform_and_lower``
with the backend's stock partitioner -> ``to_executorch`` -> the buffer written
to disk (with ``--external-weights``, xnnpack only: the parameters' placeholders are
tagged with ``delegate_constant_tag`` as executorch's llama export tags them,
``ExecutorchBackendConfig(external_constants=True)``, and ``write_tensor_data_to_file``).
edgeplug's side is ``edgeplug.lower(..., profile_memory=True)`` and ``save``; with
``--external-weights`` it runs on every backend that offers them (xnnpack, vulkan).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_MODELS = ("4x512", "8x1024", "4x2048")
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def build(layers: int, hidden: int, dtype: str, vocab: int) -> Any:
    """A transformers Llama with random weights in ``dtype``, built in that dtype (no fp32 copy on the way)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = max(hidden // 128, 2)
    wide = hidden >= 3072  # Llama-3.2-3B's shape: 8/3 MLP, grouped KV heads, tied embeddings
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=(8 * hidden) // 3 if wide else 2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(heads // 3, 1) if wide else heads,
        max_position_embeddings=256, tie_word_embeddings=wide,
    )
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, DTYPES[dtype]))
    try:
        if not wide:
            model = LlamaForCausalLM(config).eval()
        else:  # billions of weights: transformers' initialisation takes minutes; random normal ones take seconds
            with torch.device("meta"):
                model = LlamaForCausalLM(config).eval()
            model.to_empty(device="cpu")
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if p.dim() == 1:
                        p.fill_(1.0)
                        continue
                    # each tensor its own random block, tiled (copies, not draws): no two tensors alike,
                    # so a delegate that stores constants by content hash deduplicates none of them
                    flat, block = p.view(-1), torch.randn(1 << 20) * 0.02
                    for i in range(0, flat.numel(), block.numel()):
                        flat[i:i + block.numel()].copy_(block[: flat.numel() - i])
            model.model.rotary_emb = type(model.model.rotary_emb)(config)  # its buffers, computed again
            model.tie_weights()
    finally:
        torch.set_default_dtype(previous)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def param_bytes(model: Any) -> int:
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


class Stages:
    """Peak resident MiB and seconds per stage of stock's flow (edgeplug's come from its report)."""

    def __init__(self) -> None:
        from edgeplug._memory import StageMemory

        self.memory = StageMemory()
        self.rows: list[dict[str, Any]] = []

    def run(self, name: str, fn: Any) -> Any:
        self.memory.start()
        t = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - t
        self.rows.append({"stage": name, "seconds": round(seconds, 3), "peak_mib": round(self.memory.stop(), 1)})
        _progress(f"{name}: {seconds:.1f} s, peak {self.rows[-1]['peak_mib']:.0f} MiB")
        return out


def _progress(msg: str) -> None:
    # the parent reads the last one when a cell dies (out of memory, killed): how far it got
    print(f"@ {msg}", file=sys.stderr, flush=True)


def stock(model: Any, kwargs: dict, backend: str, out: Path, external: bool) -> list[dict[str, Any]]:
    import torch
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower

    import edgeplug

    st = Stages()
    b = edgeplug.get_backend(backend)
    ep = st.run("export", lambda: torch.export.export(model, (), kwargs))
    partitioner = b.make_partitioner()
    if external:
        if backend != "xnnpack":
            raise SystemExit("stock external weights: xnnpack only (its preprocess reads delegate_constant_tag)")
        # executorch's llama export tags the weights for the delegate's named data; on a lifted program
        # the parameters are placeholders
        for node in ep.graph.nodes:
            if node.op == "placeholder" and node.name in ep.graph_signature.inputs_to_parameters:
                node.meta.setdefault("custom", {})["delegate_constant_tag"] = "model"
    edge = st.run("to_edge_transform_and_lower", lambda: to_edge_transform_and_lower(ep, partitioner=[partitioner]))
    del ep
    config = ExecutorchBackendConfig(external_constants=external)
    program = st.run("to_executorch", lambda: edge.to_executorch(config))
    del edge

    def write() -> None:
        with open(out / "model.pte", "wb") as f:
            program.write_to_file(f)
        if external:
            program.write_tensor_data_to_file(str(out))

    st.run("write .pte", write)
    return st.rows


def edgeplug_side(model: Any, kwargs: dict, backend: str, out: Path, external: bool) -> list[dict[str, Any]]:
    import edgeplug

    import inspect

    options: dict[str, Any] = {"external_weights": True} if external else {}
    if "profile_memory" in inspect.signature(edgeplug.lower).parameters:  # absent before issue 27
        options["profile_memory"] = True
    st = Stages()
    lowered = st.run("lower", lambda: edgeplug.lower(model, (), backend, kwargs=kwargs, **options))
    rows = [
        {"stage": s.stage, "seconds": round(s.seconds, 3), "peak_mib": s.peak_rss_mib}
        for s in lowered.report.stages
    ]
    st.run("write .pte", lambda: lowered.save(out / "model.pte"))
    # the report's stages reset the high-water mark inside "lower": its own row is only the peak's floor
    return [*rows, st.rows[-1]] if any(r["peak_mib"] for r in rows) else st.rows


def warm_up(args: argparse.Namespace) -> None:
    """The side's flow once on a 1-layer model of the same kind: what it imports and caches on first use
    (kernel libraries, op tables) is then in the footprint, not in the growth."""
    with tempfile.TemporaryDirectory(prefix="lower-memory-") as tmp:
        import torch

        model = build(1, 64, args.dtype, 256)
        kwargs = {"input_ids": torch.zeros(1, 8, dtype=torch.long), "use_cache": False}
        side = edgeplug_side if args.side == "edgeplug" else stock
        side(model, kwargs, args.backend, Path(tmp), args.external_weights)


def cell(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import edgeplug  # noqa: F401  every library loaded before the footprint is read
    import executorch.exir  # noqa: F401
    from edgeplug._memory import rss_mib
    from edgeplug._zoo._cell import _quiet

    _quiet()
    warm_up(args)
    layers, hidden = (int(x) for x in args.model.split("x"))
    model = build(layers, hidden, args.dtype, args.vocab)
    ids = torch.randint(0, args.vocab, (1, args.seq), generator=torch.Generator().manual_seed(1))
    kwargs = {"input_ids": ids, "use_cache": False}
    gc.collect()
    footprint = rss_mib()
    weights = param_bytes(model) / 2**20
    _progress(f"model built: {weights:.0f} MiB of parameters, footprint {footprint:.0f} MiB")
    with tempfile.TemporaryDirectory(prefix="lower-memory-") as tmp:
        t = time.perf_counter()
        side = edgeplug_side if args.side == "edgeplug" else stock
        rows = side(model, kwargs, args.backend, Path(tmp), args.external_weights)
        seconds = time.perf_counter() - t
        files = {p.name: p.stat().st_size for p in Path(tmp).iterdir()}
    peak = max(r["peak_mib"] or 0.0 for r in rows)
    return {
        "side": args.side, "backend": args.backend, "model": args.model, "dtype": args.dtype, "seq": args.seq,
        "external_weights": args.external_weights, "param_mib": round(weights, 1), "footprint_mib": round(footprint, 1),
        "peak_mib": round(peak, 1), "growth_mib": round(peak - footprint, 1),
        "growth_x": round((peak - footprint) / weights, 2), "seconds": round(seconds, 2),
        "files_mib": {k: round(v / 2**20, 1) for k, v in files.items()},
        "stages": [{**r, "above_footprint_mib": round((r["peak_mib"] or 0) - footprint, 1)} for r in rows],
    }


def run_cell(model: str, backend: str, side: str, args: argparse.Namespace) -> dict[str, Any]:
    """One cell in its own process, under ``--timeout`` and (``--rss-cap-gb``) a resident-size watchdog."""
    cmd = [
        sys.executable, __file__, "--cell", "--model", model, "--backend", backend, "--side", side,
        "--dtype", args.dtype, "--seq", str(args.seq), "--vocab", str(args.vocab),
        *(["--external-weights"] if args.external_weights else []),
    ]
    # the cell's stderr (warnings, progress) goes to a file: a pipe nobody reads while the cell runs fills and blocks it
    errors = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True, start_new_session=True)
    cap_mib = args.rss_cap_gb * 1024 if args.rss_cap_gb else None
    start, killed, top = time.monotonic(), "", 0.0
    while proc.poll() is None:
        time.sleep(0.05)
        rss = _rss_of(proc.pid)
        top = max(top, rss)
        if cap_mib and rss > cap_mib:
            killed = f"killed at {rss / 1024:.1f} GiB resident (the cap is {args.rss_cap_gb} GB)"
        elif time.monotonic() - start > args.timeout:
            killed = f"killed after {args.timeout} s (the timeout)"
        if killed:
            os.killpg(proc.pid, signal.SIGKILL)
            break
    out, _ = proc.communicate()
    errors.seek(0)
    err = errors.read()
    progress = [line[2:] for line in err.splitlines() if line.startswith("@ ")]
    if proc.returncode == 0 and out.strip():
        return json.loads(out.strip().splitlines()[-1])
    why = killed or f"exit {proc.returncode}: {(err.strip().splitlines() or ['?'])[-1]}"
    return {
        "side": side, "backend": backend, "model": model, "dtype": args.dtype, "external_weights": args.external_weights,
        "error": why, "reached": progress, "seconds": round(time.monotonic() - start, 1), "max_rss_mib": round(top, 1),
    }


def _rss_of(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | params | backend | side | footprint | peak growth | × params | time | files |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['model']} | | {r['backend']} | {r['side']} | | {r['error']} | | {r['seconds']:.0f} s | "
                f"reached: {r['reached'][-1] if r['reached'] else 'nothing'} |"
            )
            continue
        files = ", ".join(f"{k} {v:.0f} MiB" for k, v in r["files_mib"].items())
        lines.append(
            f"| {r['model']} {r['dtype']} | {r['param_mib']:.0f} MiB | {r['backend']} | {r['side']} | "
            f"{r['footprint_mib']:.0f} MiB | +{r['growth_mib']:.0f} MiB | {r['growth_x']:.2f}× | {r['seconds']:.1f} s | {files} |"
        )
    return "\n".join(lines)


def stage_table(rows: list[dict[str, Any]]) -> str:
    lines = []
    for r in rows:
        if "error" in r:
            continue
        lines.append(f"{r['side']} {r['backend']} {r['model']}: " + ", ".join(
            f"{s['stage']} +{s['above_footprint_mib']:.0f} MiB/{s['seconds']:.1f} s" for s in r["stages"]
        ))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="LAYERSxHIDDEN, e.g. 8x1024")
    p.add_argument("--backends", nargs="+", default=["xnnpack", "vulkan"])
    p.add_argument("--sides", nargs="+", default=["stock", "edgeplug"], choices=["stock", "edgeplug"])
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    p.add_argument("--seq", type=int, default=32, help="tokens of the example input")
    p.add_argument("--vocab", type=int, default=12288)
    p.add_argument("--external-weights", action="store_true", help="weights into a .ptd beside the .pte")
    p.add_argument("--timeout", type=float, default=900, help="seconds per cell")
    p.add_argument("--rss-cap-gb", type=float, default=0, help="kill a cell whose resident size passes this")
    p.add_argument("--json", help="also write the rows here (JSON lines)")
    p.add_argument("--cell", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    p.add_argument("--side", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.cell:
        print(json.dumps(cell(args)))
        return
    rows = []
    for model in args.models:
        for backend in args.backends:
            for side in args.sides:
                row = run_cell(model, backend, side, args)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json.dumps(row) + "\n")
    print(table(rows))
    print()
    print(stage_table(rows))


if __name__ == "__main__":
    main()
