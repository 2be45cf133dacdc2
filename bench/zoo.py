"""The model zoo: real transformers architectures through edgeplug and stock executorch.

Each cell is one architecture (a tiny, randomly initialised transformers
model: nothing is downloaded) lowered for one backend twice in the same
process, from the same exported program:

- **edgeplug**: ``edgeplug.lower(ep, inputs, backend)`` (a dry run where the
  backend's SDK is absent: qnn, samsung), then ``edgeplug.verify`` where a
  program runs on this host (xnnpack through executorch's runtime; vulkan and
  webgpu through edgeplug's host kernels on a wgpu adapter);
- **stock**: ``executorch.exir.to_edge_transform_and_lower`` with the
  backend's own executorch partitioner, then ``to_executorch()`` (what a user
  of executorch alone runs); XNNPACK's stock program also runs, for its error.

Per cell: partitions, nodes left on the CPU by op, norms fused out of the
norms present (``aten.rsqrt`` / ``aten.rms_norm`` nodes of the exported
program), max |lowered - eager|, and edgeplug's lowering time as a ratio to
stock's (both including serialization, not verification). A cell that fails
shows the first line of its error; the run goes on.

    python bench/zoo.py [--models llama,qwen3] [--backends vulkan,xnnpack] [--jobs 2] [--out docs/zoo.md] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import logging
import os
import platform
import sys
import time
import traceback
import warnings
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Callable, Optional

import torch

SEQ, VOCAB = 8, 128
#: shared by every decoder config: 2 layers, hidden 64, 4 heads of 16, 2 key/value heads
DECODER = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
)


@dataclass(frozen=True)
class Arch:
    """One architecture: transformers config and model classes, config overrides, call kwargs."""

    config: str
    model: str
    overrides: dict = field(default_factory=dict)
    base: dict = field(default_factory=lambda: dict(DECODER))
    call: dict = field(default_factory=lambda: {"use_cache": False})
    output: str = "logits"
    note: str = ""


MODELS: dict[str, Arch] = {
    "llama": Arch("LlamaConfig", "LlamaForCausalLM"),
    "qwen3": Arch("Qwen3Config", "Qwen3ForCausalLM", note="q/k norms"),
    "gemma3": Arch("Gemma3TextConfig", "Gemma3ForCausalLM", note="text; norms weighted 1 + w, q/k norms"),
    "olmoe": Arch("OlmoeConfig", "OlmoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2, "eos_token_id": 1}, note="mixture of experts"),
    "falcon-mamba": Arch(
        "FalconMambaConfig",
        "FalconMambaForCausalLM",
        base=dict(vocab_size=VOCAB, hidden_size=64, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4),
        note="state-space (Mamba-1), unweighted norms of B, C and dt",
    ),
    "bert": Arch(
        "BertConfig",
        "BertModel",
        base=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64),
        call={},
        output="last_hidden_state",
        note="encoder, LayerNorm (no RMSNorm)",
    ),
    "mistral": Arch("MistralConfig", "MistralForCausalLM"),
    "phi3": Arch("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0, "eos_token_id": 1}),
    "olmo2": Arch("Olmo2Config", "Olmo2ForCausalLM", {"eos_token_id": 1}, note="norms after attention/MLP, q/k norms over all heads"),
    "bamba": Arch(
        "BambaConfig",
        "BambaForCausalLM",
        {"attn_layer_indices": [1], "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 1,
         "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 8},
        note="hybrid: a Mamba-2 layer, then an attention layer; gated norm in the mixer",
    ),
    "t5-encoder": Arch(
        "T5Config",
        "T5EncoderModel",
        base=dict(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4),
        call={},
        output="last_hidden_state",
        note="encoder, RMSNorm without mean subtraction (T5LayerNorm)",
    ),
    "jamba": Arch(
        "JambaConfig",
        "JambaForCausalLM",
        {"num_experts": 2, "num_experts_per_tok": 1, "attn_layer_period": 2, "attn_layer_offset": 1,
         "expert_layer_period": 2, "expert_layer_offset": 1, "mamba_d_state": 8, "mamba_d_conv": 4,
         "mamba_expand": 2, "mamba_dt_rank": 8},
        note="hybrid: a Mamba layer, then attention with a mixture of experts",
    ),
}


#: what `make zoo` runs (jamba: a second hybrid, on request)
DEFAULT_MODELS = [m for m in MODELS if m != "jamba"]


def _xnnpack():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner()


def _vulkan():
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    return VulkanPartitioner()


def _webgpu():
    from executorch.backends.webgpu.partitioner import WebGPUPartitioner

    return WebGPUPartitioner()


@dataclass(frozen=True)
class Target:
    """How a backend's cell runs: a real lowering against stock, or a dry run."""

    dry_run: bool
    stock: Optional[Callable[[], Any]]  # executorch's own partitioner, or None
    stock_absent: str = ""  # why there is no stock column


BACKENDS: dict[str, Target] = {
    "vulkan": Target(False, _vulkan),
    "webgpu": Target(False, _webgpu),
    "xnnpack": Target(False, _xnnpack),
    "qnn": Target(True, None, "needs the QNN SDK (stock cannot run here)"),
    "samsung": Target(True, None, "needs the Exynos AI Studio SDK (stock cannot run here)"),
}


# --------------------------------------------------------------------------- models


class Forward(torch.nn.Module):
    """``input_ids -> tensor`` (logits or hidden states): what both lowerings export."""

    def __init__(self, model: torch.nn.Module, call: dict, output: str) -> None:
        super().__init__()
        self.model = model
        self.call = dict(call)
        self.output = output

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(input_ids=input_ids, **self.call), self.output)


def build(name: str, layers: Optional[int] = None) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """The tiny model ``name`` and its example inputs; the same numbers in every process.

    ``layers`` overrides the config's layer count (the tests use 1)."""
    import transformers

    arch = MODELS[name]
    settings = {**arch.base, **arch.overrides}
    if layers is not None:
        settings["num_layers" if "num_layers" in settings else "num_hidden_layers"] = layers
    config = getattr(transformers, arch.config)(**settings)
    torch.manual_seed(0)
    model = getattr(transformers, arch.model)(config).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in model.modules():  # not the init's ones (or zeros): a wrong weight must show
            w = getattr(module, "weight", None)
            if "Norm" in type(module).__name__ and isinstance(w, torch.nn.Parameter):
                w.add_(0.2 * torch.randn(w.shape, generator=g, dtype=w.dtype))
    ids = torch.randint(0, VOCAB, (1, SEQ), generator=g)
    return Forward(model, arch.call, arch.output).eval(), (ids,)


def count_norms(ep: torch.export.ExportedProgram) -> int:
    """Norms present: ``rsqrt`` and ``rms_norm`` nodes of an aten-dialect program."""
    names = {"aten::rsqrt", "aten::rms_norm"}
    return sum(
        1
        for n in ep.graph.nodes
        if n.op == "call_function" and getattr(getattr(n.target, "_schema", None), "name", None) in names
    )


@lru_cache(maxsize=2)
def exported(name: str, layers: Optional[int] = None) -> tuple[torch.nn.Module, torch.export.ExportedProgram, tuple, int]:
    """(model, aten-dialect program, example inputs, norms present), once per process."""
    model, inputs = build(name, layers)
    with torch.no_grad():
        ep = torch.export.export(model, inputs)
    return model, ep, inputs, count_norms(ep)


# --------------------------------------------------------------------------- one cell


def op_label(target: Any) -> str:
    """'aten.mean.dim' for an edge or aten op (the report's spelling)."""
    op = target if isinstance(target, torch._ops.OpOverload) else getattr(target, "_op", target)
    schema = getattr(op, "_schema", None)
    if schema is not None and hasattr(op, "_overloadname"):
        return f"{schema.name.replace('::', '.')}.{op._overloadname}"
    return getattr(op, "__name__", None) or str(op)


def stock_graph_breaks(edge_ep: Any) -> tuple[int, Counter]:
    """(partitions, CPU ops) of a program stock executorch lowered, counted as edgeplug's report counts."""
    import operator

    from executorch.exir.lowered_backend_module import get_lowered_submodules

    partitions = len(get_lowered_submodules(edge_ep.graph_module))
    cpu: Counter = Counter()
    for n in edge_ep.graph_module.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        if "executorch_call_delegate" in str(n.target):
            continue
        cpu[op_label(n.target)] += 1
    return partitions, cpu


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _flat(out: Any) -> list[torch.Tensor]:
    import torch.utils._pytree as pytree

    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


@dataclass
class Side:
    """One lowering of a cell: edgeplug's or stock's."""

    ok: bool = False
    error: str = ""
    partitions: Optional[int] = None
    cpu_ops: dict = field(default_factory=dict)
    #: op -> sorted distinct reasons (edgeplug only)
    cpu_reasons: dict = field(default_factory=dict)
    seconds: Optional[float] = None
    max_abs_diff: Optional[float] = None
    verify_error: str = ""
    verify_method: str = ""
    verify_seconds: Optional[float] = None
    #: the report's own verdict (its tolerance for the dtype), with why it failed
    verify_passed: Optional[bool] = None
    verify_problems: list = field(default_factory=list)

    @property
    def cpu_nodes(self) -> Optional[int]:
        return sum(self.cpu_ops.values()) if self.ok else None


@dataclass
class Cell:
    model: str
    backend: str
    dry_run: bool
    norms_present: Optional[int] = None
    #: fusion outcome -> count (every outcome but "rejected" is a fusion)
    fusion_outcomes: dict = field(default_factory=dict)
    #: (anchor, reason) of each rejected fusion
    rejected: list = field(default_factory=list)
    edgeplug: Side = field(default_factory=Side)
    stock: Side = field(default_factory=Side)
    stock_absent: str = ""
    #: the backend has no rms_norm fusion policy (nothing to fuse into: xnnpack)
    no_policy: bool = False
    error: str = ""  # the model itself could not be built or exported

    @property
    def norms_fused(self) -> int:
        return sum(n for o, n in self.fusion_outcomes.items() if o != "rejected")

    @property
    def norms_recorded(self) -> int:
        return sum(self.fusion_outcomes.values())

    @property
    def time_ratio(self) -> Optional[float]:
        e, s = self.edgeplug.seconds, self.stock.seconds
        if self.edgeplug.ok and self.stock.ok and e and s:
            return e / s
        return None

    @classmethod
    def from_dict(cls, d: dict) -> "Cell":
        d = dict(d)
        d["edgeplug"] = Side(**d["edgeplug"])
        d["stock"] = Side(**d["stock"])
        return cls(**d)


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    # executorch's partitioners log every node at INFO: nothing below ERROR is printed. Not with
    # logging.disable, which would also drop the DEBUG records edgeplug reads a partitioner's
    # reasons from (capture_why), and every CPU node would read "it gave no reason"
    # A handler first: the basicConfig(level=INFO) some executorch modules run on import is then
    # a no-op, and cannot lower the root's level again
    logging.basicConfig(level=logging.ERROR)
    root = logging.getLogger()
    root.setLevel(logging.ERROR)
    for handler in root.handlers:
        handler.setLevel(logging.ERROR)


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) * 2.0


@lru_cache(maxsize=None)
def warm_up(backend: str) -> None:
    """Lower a tiny model both ways once per process, so neither column pays the first-use imports."""
    target = BACKENDS[backend]
    with torch.no_grad():
        ep = torch.export.export(_Tiny().eval(), (torch.randn(2, 8),))
    inputs = (torch.randn(2, 8),)
    try:
        if target.stock is not None:
            lower_stock(ep, inputs, [], target)
        lower_edgeplug(ep, inputs, backend, target.dry_run, "warm-up", verify=False)
    except Exception:
        pass  # the cell itself will say what fails


def lower_edgeplug(
    ep: Any, inputs: tuple, backend: str, dry_run: bool, model_name: str, verify: bool = True
) -> tuple[Side, Any]:
    """edgeplug.lower (timed, serialization included) then edgeplug.verify where it runs."""
    import edgeplug

    side = Side()
    try:
        gc.collect()  # each timed lowering starts from a collected heap, stock's and edgeplug's alike
        t = time.perf_counter()
        result = edgeplug.lower(copy.deepcopy(ep), inputs, backend, dry_run=dry_run, model_name=model_name)
        side.seconds = time.perf_counter() - t
    except Exception as exc:
        side.error = first_line(exc)
        return side, None
    report = result.report
    side.ok = True
    side.partitions = len(report.partitions)
    side.cpu_ops = dict(report.cpu_ops)
    reasons: dict[str, set] = {}
    for c in report.cpu_nodes:
        reasons.setdefault(c.op, set()).add(c.reason)
    side.cpu_reasons = {op: sorted(r) for op, r in reasons.items()}
    if verify and not dry_run:
        try:
            t = time.perf_counter()
            v = edgeplug.verify(result, backend)
            side.verify_seconds = time.perf_counter() - t
            side.max_abs_diff = v.max_abs_diff
            side.verify_method = v.method + (f" on {v.adapter}" if v.adapter else "")
            if hasattr(v, "passed"):
                side.verify_passed = bool(v.passed)
                side.verify_problems = list(v.failures()) if not v.passed else []
        except Exception as exc:
            side.verify_error = first_line(exc)
    return side, result


def lower_stock(ep: Any, inputs: tuple, eager: list, target: Target) -> Side:
    """executorch's to_edge_transform_and_lower with the backend's own partitioner, then to_executorch."""
    from executorch.exir import to_edge_transform_and_lower

    side = Side()
    try:
        gc.collect()
        t = time.perf_counter()
        edge = to_edge_transform_and_lower(copy.deepcopy(ep), partitioner=[target.stock()])
        paused = time.perf_counter()
        # counted before to_executorch, which rewrites the program in place (out variants, allocs)
        side.partitions, cpu = stock_graph_breaks(edge.exported_program())
        side.cpu_ops = dict(cpu)
        resumed = time.perf_counter()
        buffer = edge.to_executorch().buffer
        side.seconds = time.perf_counter() - t - (resumed - paused)
    except Exception as exc:
        side.error = first_line(exc)
        return side
    side.ok = True
    if target.stock is _xnnpack:  # the only stock delegate executorch's Python runtime runs
        try:
            from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

            if not eager:
                return side
            outs = _flat(_load_for_executorch_from_buffer(buffer).forward(tuple(inputs)))
            side.max_abs_diff = max(
                (a.double() - e.double()).abs().max().item() for a, e in zip(outs, eager)
            )
            side.verify_method = "pte"
        except Exception as exc:
            side.verify_error = first_line(exc)
    return side


def run_cell(model: str, backend: str, layers: Optional[int] = None, warm: bool = True, repeat: int = 1) -> Cell:
    """Lower ``model`` for ``backend`` with edgeplug and with stock executorch. Never raises.

    ``warm``: first lower a tiny model both ways in this process (fair timings).
    ``repeat``: lower each side that many times, alternating stock and edgeplug,
    and keep each side's fastest time (the first lowering is the one verified)."""
    _quiet()
    target = BACKENDS[backend]
    cell = Cell(model=model, backend=backend, dry_run=target.dry_run, stock_absent=target.stock_absent)
    try:
        module, ep, inputs, cell.norms_present = exported(model, layers)
        with torch.no_grad():
            eager = _flat(module(*inputs))
    except Exception as exc:
        cell.error = "build/export: " + first_line(exc)
        return cell
    import edgeplug

    try:
        cell.no_policy = edgeplug.get_backend(backend).fusion_policy("rms_norm") is None
    except Exception:
        pass
    if warm:
        warm_up(backend)
    if target.stock is not None:
        cell.stock = lower_stock(ep, inputs, eager, target)
    cell.edgeplug, result = lower_edgeplug(ep, inputs, backend, target.dry_run, model)
    if result is not None:
        fusions = result.report.fusions
        cell.fusion_outcomes = dict(Counter(str(f.outcome) for f in fusions))
        cell.rejected = [(f.anchor, f.reason) for f in fusions if str(f.outcome) == "rejected"]
    # the repeats run with the same live objects as the first stock lowering: not the first
    # lowering's programs, which would make every later lowering's garbage collection slower
    del result
    for _ in range(repeat - 1):
        _time_again(cell, ep, inputs, backend, target, model)
    return cell


def _time_again(cell: Cell, ep: Any, inputs: tuple, backend: str, target: Target, model: str) -> None:
    """One more lowering of each side that lowered, timed only; each side keeps its fastest time."""
    if target.stock is not None and cell.stock.ok:
        again = lower_stock(ep, inputs, [], target)
        if again.ok:
            cell.stock.seconds = min(cell.stock.seconds, again.seconds)
    if cell.edgeplug.ok:
        again, _ = lower_edgeplug(ep, inputs, backend, target.dry_run, model, verify=False)
        if again.ok:
            cell.edgeplug.seconds = min(cell.edgeplug.seconds, again.seconds)


def _cell_dict(model: str, backend: str, layers: Optional[int] = None, repeat: int = 1) -> dict:
    try:
        return asdict(run_cell(model, backend, layers, repeat=repeat))
    except BaseException as exc:  # run_cell guards itself; this is the last net for the pool
        cell = Cell(model=model, backend=backend, dry_run=BACKENDS[backend].dry_run)
        cell.error = first_line(exc) + " | " + traceback.format_exc().splitlines()[-1][:200]
        return asdict(cell)


def run_matrix(
    models: list[str],
    backends: list[str],
    jobs: int,
    say: Callable[[str], None] = print,
    on_cell: Optional[Callable[[list[Cell]], None]] = None,
    layers: Optional[int] = None,
    repeat: int = 1,
) -> list[Cell]:
    """Every (model, backend) cell, ``jobs`` at a time in worker processes; a dead worker fails its cell only.

    ``on_cell`` gets the cells done so far (in matrix order) after each one."""
    todo = [(m, b) for m in models for b in backends]  # model-major: a worker reuses its exported model
    done: dict[tuple[str, str], Cell] = {}

    def finished(key: tuple[str, str], cell: Cell) -> None:
        done[key] = cell
        say(_progress(cell, len(done), len(todo)))
        if on_cell is not None:
            on_cell([done[k] for k in todo if k in done])

    if jobs <= 1:
        for m, b in todo:
            finished((m, b), Cell.from_dict(_cell_dict(m, b, layers, repeat)))
        return [done[k] for k in todo]
    while len(done) < len(todo):
        pending = [k for k in todo if k not in done]
        broken = False
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(_cell_dict, m, b, layers, repeat): (m, b) for m, b in pending}
            for fut in as_completed(futures):
                key = futures[fut]
                try:
                    cell = Cell.from_dict(fut.result())
                except BrokenProcessPool:
                    broken = True
                    continue
                finished(key, cell)
        if broken:
            # the worker that died took its cell with it; which one is unknown, so the
            # first unfinished cell is blamed and the rest run again in a fresh pool
            lost = next(k for k in todo if k not in done)
            cell = Cell(model=lost[0], backend=lost[1], dry_run=BACKENDS[lost[1]].dry_run)
            cell.error = "a worker process died (crash or out of memory) while running this cell or the one beside it"
            finished(lost, cell)
    return [done[k] for k in todo]


def _progress(cell: Cell, i: int, n: int) -> str:
    e = cell.edgeplug
    status = cell.error or (f"{e.partitions} partitions, {e.cpu_nodes} CPU nodes" if e.ok else e.error)
    return f"[{i}/{n}] {cell.model} x {cell.backend}: {status}"


# --------------------------------------------------------------------------- docs/zoo.md


def _ops(cpu_ops: dict, limit: int = 6) -> str:
    if not cpu_ops:
        return "none"
    items = sorted(cpu_ops.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"`{op.removeprefix('aten.')}` ×{n}" for op, n in items[:limit])
    return text + (f", … ({len(items)} ops)" if len(items) > limit else "")


def _diff(side: Side) -> str:
    if side.max_abs_diff is not None:
        if side.verify_passed is False:
            return f"{side.max_abs_diff:.1e} **fails**: {_esc('; '.join(side.verify_problems))[:160]}"
        return f"{side.max_abs_diff:.1e}"
    if side.verify_error:
        return f"fails: {_esc(side.verify_error)}"
    return "—"


def _esc(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _pc(side: Side) -> str:
    if not side.ok:
        return f"**fails**: {_esc(side.error)}"
    return f"{side.partitions} / {side.cpu_nodes}"


def _norms(cell: Cell) -> str:
    if cell.error or not cell.edgeplug.ok:
        return "—"
    if cell.no_policy and not cell.fusion_outcomes:
        return f"— / {cell.norms_present} (no rms_norm policy)"
    text = f"{cell.norms_fused} / {cell.norms_present}"
    rejected = cell.fusion_outcomes.get("rejected", 0)
    if rejected:
        text += f" ({rejected} rejected with reason)"
    missing = (cell.norms_present or 0) - cell.norms_recorded
    if missing > 0:
        text += f" (**{missing} without a record**)"
    return text


def summary(cells: list[Cell]) -> dict[str, Any]:
    """Headline figures against issue 13's targets."""
    real = [c for c in cells if not c.dry_run and not c.error]
    both = [c for c in real if c.edgeplug.ok and c.stock.ok]
    ratios = [c.time_ratio for c in both if c.time_ratio is not None]
    diffs = [c.edgeplug.max_abs_diff for c in real if c.edgeplug.max_abs_diff is not None]
    normed = [c for c in cells if not c.error and c.edgeplug.ok and not c.no_policy]
    return {
        "cells": len(cells),
        "edgeplug_failures": sum(1 for c in cells if c.error or not c.edgeplug.ok),
        "stock_failures": sum(1 for c in real if not c.stock.ok),
        "fewer_or_equal_partitions": sum(1 for c in both if c.edgeplug.partitions <= c.stock.partitions),
        "fewer_or_equal_cpu_nodes": sum(1 for c in both if c.edgeplug.cpu_nodes <= c.stock.cpu_nodes),
        "compared": len(both),
        "cpu_nodes_edgeplug": sum(c.edgeplug.cpu_nodes for c in both),
        "cpu_nodes_stock": sum(c.stock.cpu_nodes for c in both),
        "norms_present": sum(c.norms_present or 0 for c in normed),
        "norms_fused": sum(c.norms_fused for c in normed),
        "norms_recorded": sum(c.norms_recorded for c in normed),
        "max_abs_diff": max(diffs, default=None),
        "verified": len(diffs),
        "verify_failures": sum(1 for c in real if c.edgeplug.verify_error),
        "time_ratio_median": sorted(ratios)[len(ratios) // 2] if ratios else None,
        "time_ratio_max": max(ratios, default=None),
        "cells_within_1_1x": sum(1 for r in ratios if r <= 1.1),
        "timed": len(ratios),
    }


#: how executorch's Vulkan partitioner says it has no kernel for an op
NO_KERNEL = "no operator implementation"
NORM_OPS = ("aten.rsqrt.default", "aten.mean.dim", "aten.rms_norm.default", "et_vk.rms_norm.default")


def targets(cells: list[Cell]) -> list[str]:
    """Issue 13's "done when", one line each: met or not, with the figures."""
    def decoder(c: Cell) -> bool:
        arch = MODELS.get(c.model)
        return arch is not None and arch.output == "logits"

    def ok(c: Cell) -> bool:
        return not c.error and c.edgeplug.ok

    lowered = sum(ok(c) for c in cells)
    out = [f"every cell lowers with edgeplug: {lowered} of {len(cells)} — {'met' if lowered == len(cells) else 'not met'}"]
    for backend in ("vulkan", "webgpu"):
        cs = [c for c in cells if c.backend == backend and decoder(c)]
        if not cs:
            continue
        one = [c for c in cs if ok(c) and c.edgeplug.partitions == 1]
        cpu = sum(c.edgeplug.cpu_nodes or 0 for c in cs if ok(c))
        # an op the delegate has no kernel for stays on the CPU and splits the graph where it stands
        kernelless = {c.model: sorted(op for op, why in c.edgeplug.cpu_reasons.items() if all(NO_KERNEL in r for r in why))
                      for c in cs if ok(c)}
        other = {c.model: sorted(set(c.edgeplug.cpu_ops) - set(kernelless[c.model])) for c in cs if ok(c)}
        clean = [c for c in cs if ok(c) and not other[c.model] and (kernelless[c.model] or c.edgeplug.partitions == 1)]
        split = [f"{c.model} {c.edgeplug.partitions} ({', '.join(o.removeprefix('aten.') for o in kernelless[c.model])})"
                 for c in cs if ok(c) and c.edgeplug.partitions > 1 and kernelless[c.model]]
        rest = [f"{m}: {', '.join(o.removeprefix('aten.') for o in ops)}" for m, ops in other.items() if ops]
        out.append(
            f"{backend}: 1 partition on {len(one)} of {len(cs)} decoders; "
            + (f"split only at ops without a kernel: {'; '.join(split)}; " if split else "")
            + f"{cpu} CPU nodes over the {sum(ok(c) for c in cs)} that lowered, each with the partitioner's reason; "
            + (f"CPU ops that have a kernel: {'; '.join(rest)} " if rest else "no CPU op that has a kernel ")
            + f"(target: 1 partition, 0 CPU nodes but ops without a kernel) — {'met' if len(clean) == len(cs) else 'not met'}"
        )
    cs = [c for c in cells if c.backend == "xnnpack" and decoder(c)]
    if cs:
        third = [
            c for c in cs
            if ok(c) and c.stock.ok
            and c.edgeplug.cpu_nodes * 3 <= c.stock.cpu_nodes and c.edgeplug.partitions * 3 <= c.stock.partitions
        ]
        # where stock fails to lower at all there is nothing to divide: edgeplug lowering is the win
        stock_failed = [c for c in cs if ok(c) and not c.stock.ok and not c.stock_absent]
        normed = [c for c in cs if ok(c) and any(op in c.edgeplug.cpu_ops for op in NORM_OPS)]
        met = len(third) + len(stock_failed) == len(cs) and not normed
        out.append(
            f"xnnpack: at most a third of stock's CPU nodes and partitions on {len(third)} of {len(cs)} decoders"
            + (f" (stock fails on {', '.join(c.model for c in stock_failed)}, which edgeplug lowers)" if stock_failed else "")
            + f"; a norm op ({', '.join(o.removeprefix('aten.') for o in NORM_OPS[:3])}) on the CPU in {len(normed)} "
            f"(target: all, none) — {'met' if met else 'not met'}"
        )
    policy = [c for c in cells if ok(c) and not c.no_policy]
    unrecorded = sum(max(0, (c.norms_present or 0) - c.norms_recorded) for c in policy)
    verified = [c for c in cells if c.edgeplug.max_abs_diff is not None]
    over = [c for c in verified if c.edgeplug.max_abs_diff > 1e-4]
    failed = [c for c in cells if not c.dry_run and ok(c) and c.edgeplug.verify_error]
    out.append(
        f"norms: {unrecorded} norms without a fusion record in {len(policy)} cells of backends with an rms_norm "
        f"policy (xnnpack has none); max |lowered − eager| > 1e-4 in {len(over)} of {len(verified)} verified cells, "
        f"{len(failed)} real lowerings could not verify — {'met' if not unrecorded and not over and not failed else 'not met'}"
    )
    ratios = [c.time_ratio for c in cells if c.time_ratio is not None]
    within = sum(1 for r in ratios if r <= 1.1)
    out.append(
        f"lowering time ≤ 1.1× stock on {within} of {len(ratios)} timed cells"
        f" — {'met' if ratios and within == len(ratios) else 'not met'}"
    )
    return out


def render(
    cells: list[Cell],
    command: str,
    jobs: int,
    seconds: float,
    partial: str = "",
    layers: Optional[int] = None,
    repeat: int = 1,
) -> str:
    from importlib.metadata import version

    import transformers

    et_version = version("executorch")
    lines: list[str] = []
    add = lines.append
    add("# Model zoo: transformers architectures through edgeplug and stock executorch")
    add("")
    add("Generated by (from the repository root; `make zoo` runs the same):")
    add("")
    add("```")
    add(command)
    add("```")
    add("")
    add(
        f"torch {torch.__version__}, executorch {et_version}, transformers {transformers.__version__}, "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, {jobs} cells at a time; "
        + (f"**partial: {partial}**, {seconds / 60:.1f} min so far." if partial else f"the whole run took {seconds / 60:.1f} min.")
    )
    add("")
    add(
        f"Every model is tiny and randomly initialised from its transformers config ({layers or 2} layer{'s' if (layers or 2) > 1 else ''}, hidden 64, "
        f"sequence {SEQ}; nothing downloaded), exported once (`torch.export`, no KV cache) and lowered from that "
        "same program by both columns in the same process:"
    )
    add("")
    add("- **edgeplug**: `edgeplug.lower(ep, inputs, backend)` (qnn, samsung: `dry_run=True`, their SDKs are absent), "
        "then `edgeplug.verify`;")
    add("- **stock**: `executorch.exir.to_edge_transform_and_lower(ep, partitioner=[P()])` and `.to_executorch()`, "
        "P the backend's own executorch partitioner (`VulkanPartitioner`, `WebGPUPartitioner`, `XnnpackPartitioner`).")
    add("")
    add("Columns: **partitions / CPU nodes** (call_function nodes outside every delegate, `getitem` not counted); "
        "**norms** = fused (any outcome but `rejected`) / present (`aten.rsqrt` and `aten.rms_norm` nodes of the "
        "exported program), rejections and norms without a fusion record called out; **max |Δ|** = max |lowered − eager| "
        "over the outputs (xnnpack: the .pte in executorch's runtime; vulkan, webgpu: edgeplug's host kernels on the "
        "wgpu adapter; stock vulkan/webgpu programs cannot run here); **time** = edgeplug's lowering time / stock's "
        "(export excluded, serialization included, verification excluded; "
        + (f"each side's fastest of {repeat} lowerings, the two sides alternating, each after a garbage collection, on a shared machine, so less noisy than one run)"
           if repeat > 1 else "single runs on a shared machine, so expect ±20% noise)")
        + ". A failing cell shows the first line of its error.")
    add("")
    s = summary(cells)
    add("## Summary")
    add("")

    def fmt(v: Optional[float], spec: str = ".2f") -> str:
        return "—" if v is None else format(v, spec)

    add(f"- cells: {s['cells']}; edgeplug failed in {s['edgeplug_failures']}, stock in {s['stock_failures']} "
        f"(of the real lowerings)")
    add(f"- against stock, on the {s['compared']} cells both lowered: partitions ≤ stock's in "
        f"{s['fewer_or_equal_partitions']}, CPU nodes ≤ stock's in {s['fewer_or_equal_cpu_nodes']}; CPU nodes "
        f"in all {s['compared']}: {s['cpu_nodes_edgeplug']} (edgeplug) vs {s['cpu_nodes_stock']} (stock)")
    add(f"- norms (backends with an rms_norm fusion policy): {s['norms_fused']} fused of {s['norms_present']} "
        f"present; {s['norms_recorded']} have a fusion record (fused or rejected with a reason)")
    add(f"- verification: {s['verified']} cells ran, max |lowered − eager| = {fmt(s['max_abs_diff'], '.1e')}; "
        f"{s['verify_failures']} could not verify")
    add(f"- lowering time / stock: median {fmt(s['time_ratio_median'])}×, max {fmt(s['time_ratio_max'])}×; "
        f"{s['cells_within_1_1x']} of {s['timed']} cells within 1.1×")
    add("")
    add("## Against issue 13's targets")
    add("")
    for line in targets(cells):
        add(f"- {line}")
    add("")
    add("## Matrix")
    add("")
    add("| model | backend | edgeplug partitions / CPU nodes | stock partitions / CPU nodes | norms fused / present "
        "| max \\|Δ\\| edgeplug | max \\|Δ\\| stock | time / stock |")
    add("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for c in cells:
        backend = c.backend + (" (dry run)" if c.dry_run else "")
        if c.error:
            add(f"| {c.model} | {backend} | **fails**: {_esc(c.error)} | | | | | |")
            continue
        stock = _pc(c.stock) if not c.stock_absent else c.stock_absent
        ratio = fmt(c.time_ratio) + "×" if c.time_ratio is not None else "—"
        add(f"| {c.model} | {backend} | {_pc(c.edgeplug)} | {stock} | {_norms(c)} | {_diff(c.edgeplug)} "
            f"| {_diff(c.stock)} | {ratio} |")
    add("")
    add("## CPU nodes by op")
    add("")
    add("edgeplug's reasons are the partitioner's, from `report.cpu_nodes`.")
    add("")
    for model in dict.fromkeys(c.model for c in cells):
        arch = MODELS.get(model)
        add(f"### {model}" + (f" ({arch.note})" if arch and arch.note else ""))
        add("")
        for c in (c for c in cells if c.model == model):
            if c.error:
                add(f"- **{c.backend}**: fails: {_esc(c.error)}")
                continue
            e = c.edgeplug
            add(f"- **{c.backend}**" + (" (dry run)" if c.dry_run else ""))
            if e.ok:
                add(f"  - edgeplug: {_ops(e.cpu_ops, limit=12)}")
                for op, reasons in sorted(e.cpu_reasons.items()):
                    add(f"    - `{op}`: {_esc('; '.join(reasons))[:240]}")
            else:
                add(f"  - edgeplug fails: {_esc(e.error)}")
            if c.stock_absent:
                add(f"  - stock: {c.stock_absent}")
            elif c.stock.ok:
                add(f"  - stock: {_ops(c.stock.cpu_ops, limit=12)}")
            else:
                add(f"  - stock fails: {_esc(c.stock.error)}")
            for anchor, reason in c.rejected:
                add(f"  - norm `{anchor}` not fused: {_esc(reason)}")
        add("")
    return "\n".join(lines).rstrip() + "\n"


def _names(value: Optional[str], known: dict, what: str) -> list[str]:
    if not value:
        return list(known)
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown {what} {', '.join(unknown)}; known: {', '.join(known)}")
    return names


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help=f"comma-separated, default {','.join(DEFAULT_MODELS)}; also: "
                        + ",".join(m for m in MODELS if m not in DEFAULT_MODELS))
    parser.add_argument("--backends", help="comma-separated, default every installed one of " + ",".join(BACKENDS))
    parser.add_argument("--jobs", type=int, default=2, help="cells at a time, each in its own worker process")
    parser.add_argument("--out", default="docs/zoo.md", help="the markdown to write ('-' for stdout only)")
    parser.add_argument("--json", help="also write every cell as JSON here")
    parser.add_argument("--layers", type=int, default=None, help="layers of every model (default: each config's 2)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="lower each side this many times (alternating) and keep each side's fastest time")
    args = parser.parse_args(argv)

    import edgeplug

    models = _names(args.models, MODELS, "model(s)") if args.models else list(DEFAULT_MODELS)
    installed = set(edgeplug.backends())
    backends = [b for b in _names(args.backends, BACKENDS, "backend(s)") if b in installed]
    skipped = [b for b in BACKENDS if b not in installed and (not args.backends or b in args.backends)]
    if skipped:
        print(f"not installed, skipped: {', '.join(skipped)}", file=sys.stderr)
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # wgpu only warns without it

    command = "python bench/zoo.py " + " ".join(argv if argv is not None else sys.argv[1:])
    total = len(models) * len(backends)
    t = time.perf_counter()

    def write(cells: list[Cell]) -> None:
        # after every cell: a run stopped early still leaves what it measured
        partial = "" if len(cells) == total else f"{len(cells)} of {total} cells so far"
        text = render(cells, command.strip(), args.jobs, time.perf_counter() - t, partial=partial, layers=args.layers, repeat=args.repeat)
        if args.out != "-":
            _write(args.out, text)
        if args.json:
            _write(args.json, json.dumps({"summary": summary(cells), "cells": [asdict(c) for c in cells]}, indent=2))

    cells = run_matrix(models, backends, args.jobs, say=lambda m: print(m, flush=True), on_cell=write, layers=args.layers, repeat=args.repeat)
    write(cells)
    if args.out == "-":
        print(render(cells, command.strip(), args.jobs, time.perf_counter() - t, layers=args.layers, repeat=args.repeat))
    else:
        print(f"wrote {args.out}")
    return 0


def _write(path: str, text: str) -> None:
    """Whole or not at all: a reader never sees half a file."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    raise SystemExit(main())
