"""edgeplug's .pte against stock ExecuTorch's .pte in ExecuTorch's Vulkan runtime (``--backend webgpu``: its WebGPU
runtime on wgpu-native), on a real GPU, in one run.

Two steps, because the GPU machine has no executorch (it has torch, and ExecuTorch's runtime built from
source by tools/vulkan-runtime/build.sh):

    python bench/vulkan_h200.py prepare --out .h200 [--models et-llama,llama,qwen3] [--layers 8] [--hidden 2048] [--seq 128]
    python bench/vulkan_h200.py run --dir .h200 [--rounds 20] [--json out.json]
    python bench/vulkan_h200.py profile --dir .h200 --runner PROFILE_RUNNER --out DIR   # then, here:
    python bench/vulkan_profile.py summarize DIR

``prepare`` (here) builds each decoder at a size that fills a GPU's time (8 layers x 2048 hidden, 128 tokens
by default; random, nothing downloaded), lowers it twice, by edgeplug (``edgeplug.lower(..., "vulkan")``) and
by stock ExecuTorch (``to_edge_transform_and_lower`` with ``VulkanPartitioner``), and writes both ``.pte``
files with eager's logits. The weights are random numbers laid out so the files compress (each matrix row is a
window of one random table: ``W[i, j] = t[(a*i + j) mod P]``), which lets 1.3 GB programs travel as a few MB;
every matmul is still a dense matmul over distinct values. ``run`` (on the GPU machine) loads each ``.pte`` in
the runtime (``edgeplug_vulkan_delegate.runtime.RunnerSession``), warms up, then times prefill calls with the
sides alternating, and reports the median latency, the edgeplug/stock ratio and max |logits - eager|.
"""

from __future__ import annotations

import argparse
import json
import lzma
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch

#: edgeplug's .pte; stock's; stock's as a stock user fixes it after the runtime refuses the .pte (``_stock_fixes``)
SIDES = ("edgeplug", "stock", "stock-blocked")
P = 8191  # the table's length (a prime, so every stride a < P walks all of it)


def structured_(model: torch.nn.Module, seed: int = 0) -> None:
    """Overwrite every parameter with compressible random values of a sensible scale."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(P, generator=g)
    with torch.no_grad():
        for k, (name, p) in enumerate(model.named_parameters()):
            if p.dim() >= 2:
                rows, cols = p.shape[0], p.numel() // p.shape[0]
                a = 1 + (97 * (k + 1)) % (P - 1)
                idx = (torch.arange(rows).unsqueeze(1) * a + torch.arange(cols).unsqueeze(0)) % P
                scale = 1.0 if "embed" in name or "tok_embeddings" in name else cols ** -0.5
                p.copy_((table[idx] * scale).reshape(p.shape))
            else:
                base = 1.0 if "norm" in name else 0.0
                p.copy_(base + 0.1 * table[(torch.arange(p.numel()) * 7 + k) % P].reshape(p.shape))


def build(name: str, layers: int, hidden: int, seq: int, vocab: int) -> torch.nn.Module:
    if name.startswith("handwritten-"):  # a model of edgeplug's table at its own size and weights (llvmpipe's row)
        from edgeplug.examples import load_model

        return load_model(name)[0].eval()
    heads = hidden // 128
    if name == "et-llama":  # executorch's own Llama (examples/models/llama), no KV cache
        from executorch.examples.models.llama.llama_transformer import construct_transformer
        from executorch.examples.models.llama.model_args import ModelArgs

        model = construct_transformer(ModelArgs(
            dim=hidden, n_layers=layers, n_heads=heads, n_kv_heads=heads // 2, head_dim=128, vocab_size=vocab,
            hidden_dim=2 * hidden, max_seq_len=seq, max_context_len=seq, max_batch_size=1, norm_eps=1e-5,
        ))
    else:
        import transformers

        from edgeplug._zoo._models import MODELS, Forward

        arch = MODELS[name]
        config = getattr(transformers, arch.config)(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=heads // 2, head_dim=128, max_position_embeddings=2 * seq,
            **arch.overrides,
        )
        model = Forward(getattr(transformers, arch.model)(config), arch.call, arch.output)
    model = model.eval()
    structured_(model)
    return model


def _stock_partitioner(backend: str, **options: Any) -> Any:
    """Stock's partitioner for the backend: VulkanPartitioner, or WebGPUPartitioner (which wraps it)."""
    if backend == "webgpu":
        from executorch.backends.webgpu.partitioner import WebGPUPartitioner

        return WebGPUPartitioner(**options)
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    return VulkanPartitioner(**options)


def _stock_fixes(backend: str) -> dict[str, Any]:
    """Stock's partitioner options after a stock user has fixed what the runtime refused at load, one refusal at a
    time. Vulkan: aten.logical_not and aten.eq blocked (no kernel). WebGPU, on a transformers Llama: every op the
    runtime built here does not register ("unsupported op: aten.arange.start_step"), then aten.full ("full: fill
    value is not a scalar"), the comparisons ("compare: fp32 inputs only") and bool tensors left on the CPU
    ("logical_and: a/b/out numel mismatch"; ExecuTorch's own WebGPU flow sets skip_bool_tensors)."""
    from executorch.exir.dialects._ops import ops as exir_ops

    aten = exir_ops.edge.aten
    if backend != "webgpu":
        return {"operator_blocklist": [aten.logical_not.default, aten.eq.Tensor, aten.eq.Scalar]}
    compare = [getattr(getattr(aten, c), v) for c in ("eq", "ne", "lt", "le", "gt", "ge") for v in ("Tensor", "Scalar")]
    return {"operator_blocklist": _unregistered_webgpu_ops() + [aten.full.default] + compare,
            "compile_options": {"skip_bool_tensors": True}}


def _unregistered_webgpu_ops() -> list[Any]:
    """The ops VulkanPartitioner knows that the WebGPU runtime built here does not register (its build's list)."""
    from edgeplug_webgpu._executorch import vulkan_registry_ops
    from edgeplug_webgpu.runtime_ops import runtime_key, targeted_list

    ops = targeted_list()
    if ops.file is None:
        raise SystemExit(f"prepare --backend webgpu needs a WebGPU runtime built here (its op list): {ops.note}")
    return [op for op in vulkan_registry_ops() if runtime_key(op) not in ops.names]


def prepare(a: argparse.Namespace) -> int:
    import edgeplug
    from executorch.exir import to_edge_transform_and_lower

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in a.models.split(","):
        t0 = time.perf_counter()
        model = build(name, a.layers, a.hidden, a.seq, a.vocab)
        sizes = {"layers": a.layers, "hidden": a.hidden, "seq": a.seq, "vocab": a.vocab}
        if name.startswith("handwritten-"):
            from edgeplug.examples import load_model

            (ids,) = load_model(name)[1]
            sizes = {"layers": len(model.blocks), "hidden": model.embed.embedding_dim, "seq": ids.shape[1],
                     "vocab": model.embed.num_embeddings}
        else:
            ids = torch.randint(0, a.vocab, (1, a.seq), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            ref = model(ids)
            ref = ref[0] if isinstance(ref, (tuple, list)) else ref
        sides = {}
        want = a.sides.split(",")
        old = torch.load(out / f"{name}-ref.pt")["meta"] if want != list(SIDES) else {}  # the sides kept as they are
        notes = [old.get("edgeplug_note", "")]
        if "edgeplug" in want:
            result = edgeplug.lower(model, (ids,), backend=a.backend)
            sides["edgeplug"] = (result.buffer, len(result.report.partitions), result.report.cpu_node_count)
            notes = list(result.report.notes)  # webgpu: which op list decided (the runtime built here, or the release's)
            del result
        with torch.no_grad():
            ep = torch.export.export(model, (ids,))
        import copy

        from edgeplug._zoo._lowering import stock_graph_breaks

        if "stock" in want:
            stock = to_edge_transform_and_lower(copy.deepcopy(ep), partitioner=[_stock_partitioner(a.backend)])
            parts, cpu = stock_graph_breaks(stock.exported_program())
            sides["stock"] = (stock.to_executorch().buffer, parts, sum(cpu.values()))
            del stock
        if "stock-blocked" in want:
            stock = to_edge_transform_and_lower(ep, partitioner=[_stock_partitioner(a.backend, **_stock_fixes(a.backend))])
            parts, cpu = stock_graph_breaks(stock.exported_program())
            sides["stock-blocked"] = (stock.to_executorch().buffer, parts, sum(cpu.values()))
            del stock
        del ep
        meta = {**old, "model": name, "backend": a.backend, **sizes, "params": sum(p.numel() for p in model.parameters()),
                "edgeplug_note": next((n for n in notes if "delegates only" in n), "")}
        for side, (buf, parts, cpu) in sides.items():
            (out / f"{name}-{side}.pte.xz").write_bytes(lzma.compress(buf, preset=1))
            meta[side] = {"pte_bytes": len(buf), "partitions": parts, "cpu_nodes": cpu}
        torch.save({"ids": ids, "logits": ref, "meta": meta}, out / f"{name}-ref.pt")
        xz = {s: f"{(out / f'{name}-{s}.pte.xz').stat().st_size / 2**20:.1f}" for s in sides}
        print(f"{name}: {meta['params'] / 1e6:.0f}M params, .pte {meta['edgeplug']['pte_bytes'] / 2**20:.0f} MiB "
              f"(xz MiB: {xz}), {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


def run(a: argparse.Namespace) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "vulkan_delegate"))
    from edgeplug_vulkan_delegate.runtime import VULKAN, WEBGPU, RunnerSession, find_runner

    build_ = find_runner(WEBGPU if a.backend == "webgpu" else VULKAN)
    folder = Path(a.dir)
    rows = []
    for ref_file in sorted(folder.glob("*-ref.pt")):
        name = ref_file.name[: -len("-ref.pt")]
        ref = torch.load(ref_file)
        sessions, row = {}, {"model": name, **ref["meta"]}
        try:
            for side in SIDES:
                pte = lzma.decompress((folder / f"{name}-{side}.pte.xz").read_bytes())
                try:
                    sessions[side] = RunnerSession(pte, build=build_)
                    out, _ = sessions[side].run([ref["ids"]], repeat=3)  # warm-up: pipelines, first uploads
                    logits = out[-1]
                    row[side]["max_abs_diff"] = (logits.double() - ref["logits"].double()).abs().max().item()
                    row["adapter"] = sessions[side].adapter
                except Exception as exc:
                    row[side]["error"] = str(exc).splitlines()[0][:400]
                    sessions.pop(side, None)
            times: dict[str, list[float]] = {s: [] for s in sessions}
            order = list(sessions)
            for r in range(a.rounds):
                for side in order if r % 2 == 0 else order[::-1]:  # sides alternate which goes first
                    _, t = sessions[side].run([ref["ids"]], repeat=1)
                    times[side].extend(t)
            for side, ts in times.items():
                row[side]["median_ms"] = statistics.median(ts) / 1000
                row[side]["min_ms"] = min(ts) / 1000
            for other in SIDES[1:]:
                if "edgeplug" in times and other in times:
                    row[f"ratio_vs_{other}"] = row["edgeplug"]["median_ms"] / row[other]["median_ms"]
        finally:
            for s in sessions.values():
                s.close()
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\nruntime: {build_.name} on {rows[0].get('adapter', '?') if rows else '?'}")
    for note in sorted({r.get("edgeplug_note", "") for r in rows} - {""}):
        print(f"edgeplug's lowering (prepared elsewhere): {note}")
    print()
    print("| model | params | side | partitions / CPU nodes | loads and runs | median ms | edgeplug / this | max abs diff vs eager |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        for side in SIDES:
            d = r[side]
            ratio = r.get(f"ratio_vs_{side}")
            print(f"| {r['model']} {r['layers']}x{r['hidden']}, seq {r['seq']} | {r['params'] / 1e6:.0f}M | {side} "
                  f"| {d['partitions']} / {d['cpu_nodes']} | {'no: ' + d['error'] if 'error' in d else 'yes'} "
                  f"| {d['median_ms']:.2f} | " if 'median_ms' in d else f"| {r['model']} | | {side} | {d['partitions']} / {d['cpu_nodes']} | no: {d.get('error', '?')} | - | ", end="")
            print((f"{ratio:.2f}x" if ratio else "-") + f" | {d['max_abs_diff']:.1e} |" if "max_abs_diff" in d else "- | - |")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


def profile(a: argparse.Namespace) -> int:
    """Each .pte in a build.sh --profile runner: ``warmup`` + ``calls`` prefills, its ETDump written to --out
    (read here by ``bench/vulkan_profile.py summarize``: the GPU machine has no executorch to parse it)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "vulkan_delegate"))
    from edgeplug_vulkan_delegate.runtime import RunnerSession, _build_of

    build_ = _build_of(Path(a.runner))
    folder, out = Path(a.dir), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"calls": a.calls, "runtime": build_.name, "errors": {}}
    for ref_file in sorted(folder.glob("*-ref.pt")):
        name = ref_file.name[: -len("-ref.pt")]
        ids = torch.load(ref_file)["ids"]
        for side in ("edgeplug", "stock-blocked"):
            pte = lzma.decompress((folder / f"{name}-{side}.pte.xz").read_bytes())
            try:
                with RunnerSession(pte, build=build_) as s:
                    if not s.profiling:
                        raise RuntimeError(f"{a.runner} was built without the event tracer (build.sh --profile)")
                    meta["adapter"] = s.adapter
                    for _ in range(a.warmup + a.calls):
                        s.run([ids])
                    n = s.etdump(out / f"{name}-{side}.etdump")
                print(f"{name} {side}: ETDump {n:,} bytes", flush=True)
            except Exception as exc:
                meta["errors"][f"{name}:{side}"] = str(exc).splitlines()[0][:300]
                print(f"{name} {side}: {meta['errors'][f'{name}:{side}']}", flush=True)
    (out / "profile.json").write_text(json.dumps(meta, indent=1))
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare")
    pp.add_argument("--out", default=".h200")
    pp.add_argument("--backend", default="vulkan", choices=("vulkan", "webgpu"))
    pp.add_argument("--models", default="et-llama,llama,qwen3")
    pp.add_argument("--layers", type=int, default=8)
    pp.add_argument("--hidden", type=int, default=2048)
    pp.add_argument("--seq", type=int, default=128)
    pp.add_argument("--vocab", type=int, default=512)
    pp.add_argument("--sides", default=",".join(SIDES),
                    help="the sides to lower again (the others' files and records kept from an earlier prepare)")
    pr = sub.add_parser("run")
    pr.add_argument("--dir", default=".h200")
    pr.add_argument("--backend", default="vulkan", choices=("vulkan", "webgpu"),
                    help="whose runtime runs the .pte files: ExecuTorch's Vulkan runtime or its WebGPU runtime")
    pr.add_argument("--rounds", type=int, default=20)
    pr.add_argument("--json", default="")
    pf = sub.add_parser("profile")
    pf.add_argument("--dir", default=".h200")
    pf.add_argument("--runner", required=True, help="edgeplug-vulkan-runner of a build.sh --profile build")
    pf.add_argument("--out", required=True)
    pf.add_argument("--calls", type=int, default=5)
    pf.add_argument("--warmup", type=int, default=2)
    a = p.parse_args(argv)
    return {"prepare": prepare, "run": run, "profile": profile}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
