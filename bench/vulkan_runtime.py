"""ExecuTorch's own Vulkan runtime (or, with ``--backend webgpu``, its WebGPU runtime on wgpu-native) against
edgeplug's host emulation, and against stock ExecuTorch.

For each case the model is lowered twice in one process, by edgeplug (``edgeplug.lower(...,
"vulkan")``) and by stock ExecuTorch (``to_edge_transform_and_lower`` with ``VulkanPartitioner``;
``WebGPUPartitioner`` for webgpu), and then run:

- **real**: edgeplug's ``.pte`` in ExecuTorch's Vulkan runtime (``edgeplug-vulkan-runner``, built by
  ``tools/vulkan-runtime/build.sh``), on whatever Vulkan adapter it opens (llvmpipe here), or in its WebGPU
  runtime (``edgeplug-webgpu-runner``, ``tools/webgpu-runtime/build.sh``);
- **emulation**: the same lowered program on edgeplug's host kernels (``verify_method="kernels"``);
- **stock**: stock's ``.pte`` in the same real runtime;

each against eager (the quantized model's eager for a quantized case). A program that keeps state
(a KV cache) runs its prefill and 3 decode steps in one loaded program, so buffers carry over.
Columns: max |real - eager|, max |emulation - eager|, max |real - emulation| (over every output of
every step), and stock's max |real - eager| or the runtime's own error.

    python bench/vulkan_runtime.py [--backend vulkan|webgpu] [--sets zoo,examples,optimum,quantized,rmsnorm,seed]
                                   [--models llama,qwen3] [--json out.json]

Needs a built runner (``EDGEPLUG_VULKAN_RUNNER``, ``EDGEPLUG_WEBGPU_RUNNER`` or the build cache;
docs/vulkan-runtime.md, docs/webgpu-runtime.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

import edgeplug
from edgeplug._failures import first_line
from edgeplug._inputs import ExampleInputs
from edgeplug._verify.targets import find_device_runtime, run_device_runtime, run_kernels, _runtime_inputs
from edgeplug._verify.steps import decode_steps

SETS = ("zoo", "examples", "optimum", "quantized", "rmsnorm", "seed")


@dataclass
class Row:
    set: str
    case: str
    outputs: int = 0
    steps: int = 0
    real_vs_eager: Optional[float] = None
    emulation_vs_eager: Optional[float] = None
    real_vs_emulation: Optional[float] = None
    stock_vs_eager: Optional[float] = None
    stock_note: str = ""
    error: str = ""
    adapter: str = ""
    seconds: float = 0.0


def _max_diff(a: list, b: list) -> float:
    """max |a - b| over paired outputs (the last len(b) of a, where a holds mutated buffers first); NaN
    anywhere on either side counts as infinite."""
    a = list(a)[len(a) - len(b):] if len(a) > len(b) else list(a)
    worst = 0.0
    for x, y in zip(a, b):
        x, y = x.double(), y.double()
        if x.shape != y.shape:
            return float("inf")
        # NaN and infinities compared by position (a NaN eps gives NaN in eager and the runtime alike)
        if not torch.equal(torch.isnan(x), torch.isnan(y)) or not torch.equal(torch.isinf(x), torch.isinf(y)):
            return float("inf")
        if torch.isinf(x).any() and not torch.equal(x[torch.isinf(x)], y[torch.isinf(y)]):
            return float("inf")
        finite = torch.isfinite(x)
        if finite.any():
            worst = max(worst, (x[finite] - y[finite]).abs().max().item())
    return worst


def _stock_partitioner(backend: str) -> Any:
    if backend == "webgpu":
        from executorch.backends.webgpu.partitioner import WebGPUPartitioner

        return WebGPUPartitioner()
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    return VulkanPartitioner()


def _stock_pte(model: Any, args: tuple, kwargs: dict, backend: str = "vulkan") -> bytes:
    from executorch.exir import to_edge_transform_and_lower

    ep = model if isinstance(model, torch.export.ExportedProgram) else torch.export.export(model, args, kwargs or None)
    return to_edge_transform_and_lower(ep, partitioner=[_stock_partitioner(backend)]).to_executorch().buffer


def run_case(set_name: str, name: str, model: Any, args: tuple, kwargs: Optional[dict] = None,
             scheme: Optional[str] = None, stock: bool = True, backend_name: str = "vulkan") -> Row:
    row = Row(set_name, name)
    t0 = time.perf_counter()
    kwargs = kwargs or {}
    backend = edgeplug.get_backend(backend_name)
    runtime, why = find_device_runtime(backend)
    if runtime is None:
        raise SystemExit(f"vulkan_runtime.py: {why or f'backend {backend_name!r} declares no runtime of its own'}")
    try:
        subject = edgeplug.quantize(model, args, backend_name, scheme, kwargs=kwargs) if scheme else model
        result = edgeplug.lower(subject, args, backend=backend_name, kwargs=kwargs or None)
        steps, _ = decode_steps(result)
        calls = [s.inputs for s in steps]
        ref = [list(result.reference.outputs), *[s.outputs for s in steps]]
        real = run_device_runtime(result, runtime, calls)
        row.adapter = real.adapter
        emu = run_kernels(result, backend, calls)
        reals = [real.outputs, *real.steps]
        emus = [emu.outputs, *emu.steps]
        row.outputs, row.steps = len(ref[0]), len(steps)
        row.real_vs_eager = max(_max_diff(r, e) for r, e in zip(reals, ref))
        row.emulation_vs_eager = max(_max_diff(r, e) for r, e in zip(emus, ref))
        row.real_vs_emulation = max(_max_diff(r, e[len(e) - len(x):] if len(e) > len(x) else e)
                                    for r, e, x in zip(reals, emus, ref))
    except Exception as exc:  # a case that cannot run is named with the runtime's own error
        row.error = first_line(exc)
        result = None
    if stock and scheme is None:
        try:
            from edgeplug_vulkan_delegate.runtime import RunnerSession

            if result is None:  # edgeplug's side failed: stock still runs, on the example inputs alone
                from edgeplug._inputs import runtime_inputs

                ep = model if isinstance(model, torch.export.ExportedProgram) else torch.export.export(
                    copy.deepcopy(model), args, kwargs or None)
                flat = [runtime_inputs(ep, ExampleInputs(args, kwargs))]
                with torch.no_grad():
                    out = ep.module()(*copy.deepcopy(args), **copy.deepcopy(kwargs))
                ref = [list(out) if isinstance(out, (tuple, list)) else [out]]
            else:
                flat = [_runtime_inputs(result), *(_runtime_inputs(result, c) for c in calls)]
            with torch.no_grad():
                pte = _stock_pte(copy.deepcopy(model), args, kwargs, backend_name)
            with RunnerSession(pte, build=runtime.build) as s:
                outs = [s.run(f)[0] for f in flat]
            row.stock_vs_eager = max(_max_diff([o for o in out if isinstance(o, torch.Tensor)], e)
                                     for out, e in zip(outs, ref))
        except Exception as exc:
            row.stock_note = first_line(exc)
    row.seconds = time.perf_counter() - t0
    return row


# ---- the cases ---------------------------------------------------------------------------------

def zoo_cases(models: Optional[list[str]]) -> Iterator[tuple[str, Any, tuple, dict]]:
    from edgeplug._zoo._models import DEFAULT_MODELS, load_entry

    for key in models or DEFAULT_MODELS:
        model, args, kwargs = load_entry(key, layers=1)
        yield key, model, args, kwargs


def example_cases() -> Iterator[tuple[str, Any, tuple, dict]]:
    """executorch's own example models (executorch.examples.models), tiny and random."""
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    tiny = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, vocab_size=128, hidden_dim=128,
                max_seq_len=32, max_context_len=32, max_batch_size=1)
    variants = {
        "llama": dict(norm_eps=1e-5),
        "llama-kv": dict(norm_eps=1e-5, use_kv_cache=True),
        "qwen3": dict(norm_eps=1e-6, use_qk_norm=True, qk_norm_before_rope=True, use_hf_rope=True, rope_theta=1e6),
        "lfm2": dict(norm_eps=1e-5, layer_types=["conv", "full_attention"]),
    }
    for name, over in variants.items():
        torch.manual_seed(0)
        model = construct_transformer(ModelArgs(**tiny, **over)).eval()
        tokens = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1))
        args = (tokens, {"input_pos": torch.arange(8)}) if over.get("use_kv_cache") else (tokens,)
        yield name, model, args, {}
    from edgeplug.testing.programs import mobilenet_blocks

    for version in ("v2", "v3"):
        model, args = mobilenet_blocks(version)
        yield f"mobilenet_{version}-blocks", model, args, {}


def optimum_cases(models: Optional[list[str]]) -> Iterator[tuple[str, Any, tuple, dict]]:
    """optimum-executorch's KV-cache program (static cache, cache_position), exported as it exports it."""
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from deploy import build, exportable

    for arch in models or ("llama",):
        max_len = 32
        ep = exportable(build(arch, 2, 64, max_len, 128), max_len).export()["model"]
        prompt = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1))
        yield f"optimum {arch} (static KV cache)", ep, (), {"input_ids": prompt, "cache_position": torch.arange(8)}


def rmsnorm_cases() -> Iterator[tuple[str, Any, tuple, dict]]:
    from edgeplug.testing.rms_norm_cases import ACCEPTED, REJECTED, Bundle

    cases = [c for c in (*ACCEPTED, *REJECTED) if c.dtype == torch.float32 and not c.whole]
    bundle = Bundle(cases)
    yield f"rms_norm catalogue ({len(cases)} fp32 variants, one program)", bundle, bundle.inputs(), {}


class Seed003(nn.Module):
    """The Vulkan seed report's three cases: a leaf weight, a (1 + w) weight, and a runtime (1 + scale)."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(1 + 0.1 * torch.randn(d, generator=g))
        self.dw = nn.Parameter(0.1 * torch.randn(d, generator=g))

    @staticmethod
    def norm(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.norm(x) * self.w, self.norm(x) * (1.0 + self.dw), self.norm(x) * (1 + scale)


def seed_cases() -> Iterator[tuple[str, Any, tuple, dict]]:
    g = torch.Generator().manual_seed(1)
    x, scale = torch.randn(1, 8, 64, generator=g), 0.1 * torch.rand(1, 1, 64, generator=g)
    for i, name in enumerate(("leaf weight", "1 + w weight", "runtime 1 + scale")):
        model = _Pick(Seed003().eval(), i)
        yield f"seed 003: {name}", model, (x, scale), {}


class _Pick(nn.Module):
    def __init__(self, inner: nn.Module, i: int) -> None:
        super().__init__()
        self.inner, self.i = inner, i

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.inner(x, scale)[self.i]


def gather(sets: list[str], models: Optional[list[str]]) -> Iterator[tuple[str, str, Any, tuple, dict, Optional[str]]]:
    if "seed" in sets:
        for c in seed_cases():
            yield ("seed", *c, None)
    if "rmsnorm" in sets:
        for c in rmsnorm_cases():
            yield ("rmsnorm", *c, None)
    if "examples" in sets:
        for c in example_cases():
            yield ("examples", *c, None)
    if "zoo" in sets:
        for c in zoo_cases(models):
            yield ("zoo", *c, None)
    if "quantized" in sets:
        for key, model, args, kwargs in zoo_cases(models or ["llama", "qwen3"]):
            for scheme in ("w8", "w4-g32"):
                yield ("quantized", f"{key} {scheme}", model, args, kwargs, scheme)
    if "optimum" in sets:
        for c in optimum_cases(None):
            yield ("optimum", *c, None)


def _fmt(v: Optional[float]) -> str:
    return "—" if v is None else f"{v:.1e}"


def markdown(rows: list[Row]) -> str:
    lines = [
        "| set | case | steps | real vs eager | emulation vs eager | real vs emulation | stock .pte in the real runtime |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r.error:
            lines.append(f"| {r.set} | {r.case} | | not run: {r.error} | | | |")
            continue
        stock = _fmt(r.stock_vs_eager) if r.stock_vs_eager is not None else (r.stock_note or "—")
        lines.append(
            f"| {r.set} | {r.case} | {1 + r.steps} | {_fmt(r.real_vs_eager)} | {_fmt(r.emulation_vs_eager)} "
            f"| {_fmt(r.real_vs_emulation)} | {stock} |"
        )
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="vulkan", choices=("vulkan", "webgpu"),
                   help="whose runtime: ExecuTorch's Vulkan runtime, or its WebGPU runtime on wgpu-native")
    p.add_argument("--sets", default=",".join(SETS))
    p.add_argument("--models", default="", help="zoo models (default: the zoo's default set)")
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    sets = [s for s in a.sets.split(",") if s]
    bad = sorted(set(sets) - set(SETS))
    if bad:
        p.error(f"unknown set(s) {', '.join(bad)}; choose from {', '.join(SETS)}")
    models = [m for m in a.models.split(",") if m] or None
    rows: list[Row] = []
    from edgeplug._zoo._cell import _quiet

    _quiet()  # executorch's partitioners log every node at INFO
    for set_name, name, model, args, kwargs, scheme in gather(sets, models):
        print(f"[{len(rows) + 1}] {set_name}: {name} ...", file=sys.stderr, flush=True)
        row = run_case(set_name, name, model, args, kwargs, scheme, backend_name=a.backend)
        rows.append(row)
        print(f"    real {_fmt(row.real_vs_eager)}  emulation {_fmt(row.emulation_vs_eager)}  "
              f"real-emulation {_fmt(row.real_vs_emulation)}  stock {_fmt(row.stock_vs_eager) if row.stock_vs_eager is not None else row.stock_note or '—'}"
              + (f"  ERROR {row.error}" if row.error else "") + f"  ({row.seconds:.1f} s)", file=sys.stderr, flush=True)
    adapters = sorted({r.adapter for r in rows if r.adapter})
    print(f"runtime: {', '.join(adapters)}\n")
    print(markdown(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
