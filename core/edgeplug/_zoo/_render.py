"""What a zoo run shows: the terminal's summary table, and the Markdown ``docs/zoo.md`` is generated from."""

from __future__ import annotations

import os
import platform
from dataclasses import replace
from importlib.metadata import version
from typing import Any, Optional

from edgeplug._zoo._record import FLOAT, Cell, Side
from edgeplug._zoo._models import MODELS, SEQ, label
from edgeplug._zoo._run import status_text


def table(cells: list[Cell]) -> str:
    """The terminal's summary: a row per cell, then the counts by what became of the cells."""
    rows = [("model", "backend", "scheme", "outcome", "stock", "time / stock")]
    for c in cells:
        stock = "—"
        if c.status == "ran" and not c.error:
            stock = c.stock_absent if c.stock_absent else (_pc(c.stock) if c.stock.ok else f"fails: {c.stock.error}")
        ratio = f"{c.time_ratio:.2f}×" if c.time_ratio is not None else "—"
        rows.append((c.label, c.backend + (" (dry run)" if c.dry_run else ""), c.scheme, status_text(c), stock, ratio))
    widths = [min(60, max(len(r[i]) for r in rows)) for i in range(len(rows[0]))]
    lines = ["  ".join(v[:60].ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    counts: dict[str, int] = {}
    for c in cells:
        what = c.status if c.status != "ran" else ("failed" if c.error or not c.edgeplug.ok else "lowered")
        counts[what] = counts.get(what, 0) + 1
    lines.append("")
    lines.append(f"{len(cells)} cells: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return "\n".join(lines)


# --------------------------------------------------------------------------- docs/zoo.md


def _ops_markdown(cpu_ops: dict, limit: int = 6) -> str:
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
    if side.verify_method == "none":
        return "not run (no runtime for it here)"
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


def _settled(cell: Cell) -> Cell:
    """A cell whose process timed out, ran out of memory, crashed or was lost reads as a failed cell."""
    if cell.status == "ran" or cell.error:
        return cell
    return replace(cell, error=f"{cell.status}: {cell.detail}")


def summary(cells: list[Cell]) -> dict[str, Any]:
    """Headline figures against issue 13's targets."""
    cells = [_settled(c) for c in cells]
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
    cells = [_settled(c) for c in cells]
    lowered = sum(_edgeplug_lowered(c) for c in cells)
    out = [f"every cell lowers with edgeplug: {lowered} of {len(cells)} — {'met' if lowered == len(cells) else 'not met'}"]
    for backend in ("vulkan", "webgpu"):
        cs = [c for c in cells if c.backend == backend and _decoder(c)]
        if cs:
            out.append(_gpu_target(backend, cs))
    cs = [c for c in cells if c.backend == "xnnpack" and _decoder(c)]
    if cs:
        out.append(_third_of_stock_target(cs))
    out.append(_norms_and_verification_target(cells))
    ratios = [c.time_ratio for c in cells if c.time_ratio is not None]
    within = sum(1 for r in ratios if r <= 1.1)
    out.append(
        f"lowering time ≤ 1.1× stock on {within} of {len(ratios)} timed cells"
        f" — {'met' if ratios and within == len(ratios) else 'not met'}"
    )
    return out


def _decoder(c: Cell) -> bool:
    arch = MODELS.get(c.model)
    return arch is not None and arch.output == "logits"


def _edgeplug_lowered(c: Cell) -> bool:
    return not c.error and c.edgeplug.ok


def _gpu_target(backend: str, cs: list[Cell]) -> str:
    """vulkan's or webgpu's decoders: one partition each, the CPU only for ops without a kernel."""
    ok = _edgeplug_lowered
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
    return (
        f"{backend}: 1 partition on {len(one)} of {len(cs)} decoders; "
        + (f"split only at ops without a kernel: {'; '.join(split)}; " if split else "")
        + f"{cpu} CPU nodes over the {sum(ok(c) for c in cs)} that lowered, each with the partitioner's reason; "
        + (f"CPU ops that have a kernel: {'; '.join(rest)} " if rest else "no CPU op that has a kernel ")
        + f"(target: 1 partition, 0 CPU nodes but ops without a kernel) — {'met' if len(clean) == len(cs) else 'not met'}"
    )


def _third_of_stock_target(cs: list[Cell]) -> str:
    """xnnpack's decoders: at most a third of stock's CPU nodes and partitions, no norm op on the CPU."""
    ok = _edgeplug_lowered
    third = [
        c for c in cs
        if ok(c) and c.stock.ok
        and c.edgeplug.cpu_nodes * 3 <= c.stock.cpu_nodes and c.edgeplug.partitions * 3 <= c.stock.partitions
    ]
    # where stock fails to lower at all there is nothing to divide: edgeplug lowering is the win
    stock_failed = [c for c in cs if ok(c) and not c.stock.ok and not c.stock_absent]
    normed = [c for c in cs if ok(c) and any(op in c.edgeplug.cpu_ops for op in NORM_OPS)]
    met = len(third) + len(stock_failed) == len(cs) and not normed
    return (
        f"xnnpack: at most a third of stock's CPU nodes and partitions on {len(third)} of {len(cs)} decoders"
        + (f" (stock fails on {', '.join(c.model for c in stock_failed)}, which edgeplug lowers)" if stock_failed else "")
        + f"; a norm op ({', '.join(o.removeprefix('aten.') for o in NORM_OPS[:3])}) on the CPU in {len(normed)} "
        f"(target: all, none) — {'met' if met else 'not met'}"
    )


def _norms_and_verification_target(cells: list[Cell]) -> str:
    """Every norm recorded where a policy fuses them; every verified cell within 1e-4, none that could not verify."""
    ok = _edgeplug_lowered
    policy = [c for c in cells if ok(c) and not c.no_policy]
    unrecorded = sum(max(0, (c.norms_present or 0) - c.norms_recorded) for c in policy)
    verified = [c for c in cells if c.edgeplug.max_abs_diff is not None]
    over = [c for c in verified if c.edgeplug.max_abs_diff > 1e-4]
    failed = [c for c in cells if not c.dry_run and ok(c) and c.edgeplug.verify_error]
    unrun = sorted({c.backend for c in cells if not c.dry_run and ok(c) and c.edgeplug.verify_method == "none"})
    return (
        f"norms: {unrecorded} norms without a fusion record in {len(policy)} cells of backends with an rms_norm "
        f"policy (xnnpack has none); max |lowered − eager| > 1e-4 in {len(over)} of {len(verified)} verified cells, "
        f"{len(failed)} real lowerings could not verify"
        + (f" ({', '.join(unrun)}: no runtime for its programs on this host, not run)" if unrun else "")
        + f" — {'met' if not unrecorded and not over and not failed else 'not met'}"
    )


def render_page(
    cells: list[Cell],
    command: str,
    jobs: int,
    seconds: float,
    partial: str = "",
    layers: Optional[int] = None,
    repeat: int = 1,
    executor: str = "local",
) -> str:
    """docs/zoo.md: how the run was made, the summary against issue 13's targets, the matrix, CPU ops by model."""
    cells = [_settled(c) for c in cells]
    lines = [
        *_how_it_ran(command, jobs, seconds, partial, layers, repeat, executor),
        *_how_to_run_more(),
        *_summary_lines(cells),
        *_matrix_lines(cells),
        *_cpu_ops_lines(cells),
    ]
    return "\n".join(lines).rstrip() + "\n"


def _fmt(v: Optional[float], spec: str = ".2f") -> str:
    return "—" if v is None else format(v, spec)


def _how_it_ran(command: str, jobs: int, seconds: float, partial: str, layers: Optional[int], repeat: int, executor: str) -> list[str]:
    """The page's title, the command, the versions and machine, the models, and what each column means."""
    # torch and transformers: the zoo's CLI starts (and parses its arguments) without them
    import torch
    import transformers

    et_version = version("executorch")
    lines: list[str] = []
    add = lines.append
    add(PAGE_TITLE)
    add("")
    add("Generated by (from the repository root; `make zoo` runs the same):")
    add("")
    add("```")
    add(command)
    add("```")
    add("")
    add(
        f"torch {torch.__version__}, executorch {et_version}, transformers {transformers.__version__}, "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, {jobs} cells at a time "
        f"({'local processes' if executor == 'local' else 'Ray tasks'}, each cell in its own process); "
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
    return lines


def _how_to_run_more() -> list[str]:
    """How cells are isolated, how to run another set or on Ray, and the rules of the results file."""
    lines: list[str] = []
    add = lines.append
    add("Each cell (model × backend × scheme) ran in its own process, with a timeout and a memory limit; "
        "a cell that ran past either, crashed, or whose worker was lost (after its retries) is a row that says so. "
        "To run another set, or on a Ray cluster (`pip install 'edgeplug[ray]'`):")
    add("")
    add("```")
    add("edgeplug zoo --models llama,qwen3,@more-models.txt,my_models.py:build --backends xnnpack,vulkan \\")
    add("  --schemes float,8a8w --compare-stock --jobs 2 --timeout 600 --memory-limit 8000 --out cells.jsonl")
    add("edgeplug zoo ... --out cells.jsonl --resume            # after an interruption: only the missing cells")
    add("edgeplug zoo ... --executor ray [--address HOST:PORT]   # a Ray task per cell, the same cell function")
    add("```")
    add("")
    add("`cells.jsonl` holds one JSON line per finished cell (`edgeplug._zoo.load_cells` reads it); "
        "`--markdown FILE.md` writes this page.")
    add("")
    add(JOURNAL_RULES)
    add("")
    return lines


def _summary_lines(cells: list[Cell]) -> list[str]:
    """The summary's figures, then each of issue 13's targets, met or not."""
    s = summary(cells)
    fmt = _fmt
    lines = ["## Summary", ""]
    add = lines.append
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
    return lines


def _matrix_lines(cells: list[Cell]) -> list[str]:
    """One row a cell: both sides' partitions and CPU nodes, norms, max |Δ|, and the time ratio."""
    lines = ["## Matrix", ""]
    add = lines.append
    add("| model | backend | scheme | edgeplug partitions / CPU nodes | stock partitions / CPU nodes | norms fused / present "
        "| max \\|Δ\\| edgeplug | max \\|Δ\\| stock | time / stock |")
    add("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for c in cells:
        backend = c.backend + (" (dry run)" if c.dry_run else "")
        if c.error:
            add(f"| {c.label} | {backend} | {c.scheme} | **fails**: {_esc(c.error)} | | | | | |")
            continue
        stock = _pc(c.stock) if not c.stock_absent else c.stock_absent
        ratio = _fmt(c.time_ratio) + "×" if c.time_ratio is not None else "—"
        add(f"| {c.label} | {backend} | {c.scheme} | {_pc(c.edgeplug)} | {stock} | {_norms(c)} | {_diff(c.edgeplug)} "
            f"| {_diff(c.stock)} | {ratio} |")
    add("")
    return lines


def _cpu_ops_lines(cells: list[Cell]) -> list[str]:
    """Per model, per cell: the ops each side left on the CPU (edgeplug's with the partitioner's reasons)."""
    lines = ["## CPU nodes by op", ""]
    add = lines.append
    add("edgeplug's reasons are the partitioner's, from `report.cpu_nodes`.")
    add("")
    for model in dict.fromkeys(c.model for c in cells):
        arch = MODELS.get(model)
        add(f"### {label(model)}" + (f" ({arch.note})" if arch and arch.note else ""))
        add("")
        for c in (c for c in cells if c.model == model):
            name = f"**{c.backend}**" + (f" {c.scheme}" if c.scheme != FLOAT else "")
            if c.error:
                add(f"- {name}: fails: {_esc(c.error)}")
                continue
            e = c.edgeplug
            add(f"- {name}" + (" (dry run)" if c.dry_run else ""))
            if e.ok:
                add(f"  - edgeplug: {_ops_markdown(e.cpu_ops, limit=12)}")
                for op, reasons in sorted(e.cpu_reasons.items()):
                    add(f"    - `{op}`: {_esc('; '.join(reasons))[:240]}")
            else:
                add(f"  - edgeplug fails: {_esc(e.error)}")
            if c.stock_absent:
                add(f"  - stock: {c.stock_absent}")
            elif c.stock.ok:
                add(f"  - stock: {_ops_markdown(c.stock.cpu_ops, limit=12)}")
            else:
                add(f"  - stock fails: {_esc(c.stock.error)}")
            for anchor, reason in c.rejected:
                add(f"  - norm `{anchor}` not fused: {_esc(reason)}")
        add("")
    return lines


#: what docs/zoo.md says of the results file and of runs that cannot go on
JOURNAL_RULES = (
    'The results file is only ever appended to, one whole line per cell, by one run at a time: a second run on a '
    'file a run is writing is refused (a lock). With `--resume`, a line that holds no cell (cut short by a crash,'
    ' garbage, JSON of another shape) is named on one `edgeplug zoo: warning:` line, `--quiet` or not, stays in '
    'the file, and its cell runs again; a file none of whose lines is a cell is refused untouched. `--out` and '
    "`--markdown` are checked before any cell runs, by `edgeplug lower`'s output rules (not a folder, writable, "
    'not the same file, not a model file or model list), and `--markdown` rewrites only a zoo page. A model '
    "function that hangs, exits or allocates past `--memory-limit` is its own cell's outcome (`timeout`, "
    '`crashed` or a build error naming the `sys.exit`, `memory`) under both executors. Under Ray the run reports '
    "the cluster's start time and never waits without bound: the cluster gets `--timeout` to start or answer (an "
    '`--address` where nothing listens is refused at once), a local cluster no cell fits on (`--memory-limit` '
    "over a node's memory) is refused at once, and a run where no cell starts within `--timeout`, or none "
    'finishes within (`--retries` + 2) × `--timeout`, stops with a line saying so; the cells finished are kept '
    'for `--resume`.'
)
PAGE_TITLE = "# Model zoo: transformers architectures through edgeplug and stock executorch"


# --------------------------------------------------------------------------- the quantized table

#: docs/zoo.md keeps the quantized run's section between these lines: a later quantized run replaces it
QUANTIZED_BEGIN = "<!-- edgeplug zoo: quantized cells (a quantized run rewrites this section) -->"
QUANTIZED_END = "<!-- end of the quantized cells -->"
#: issue 22's targets: cosine of the .pte's logits to the float model's, per scheme family
COSINE_TARGETS = {"8a8w": 0.99, "8da4w": 0.98}
LATENCY_TARGET, SIZE_TARGET = 0.85, 1.05


def _lowers(side: Side, dry_run: bool = False) -> str:
    if side.ok:
        return "lowers" + (" (dry run)" if dry_run else "")
    if not side.error:
        return "—"
    return f"**fails** at {side.stage or 'lower'}: {_esc(side.error)[:140]}"


def _pair(e: Optional[float], s: Optional[float], spec: str) -> str:
    f = lambda v: "—" if v is None else format(v, spec)  # noqa: E731
    return f"{f(e)} / {f(s)}"


def _ratio(e: Optional[float], ratio: Optional[float], spec: str) -> str:
    if e is None:
        return "—"
    return format(e, spec) + (f" ({ratio:.2f}×)" if ratio is not None else "")


def _cosine_target(scheme: str) -> Optional[float]:
    return COSINE_TARGETS.get(scheme.split("-")[0].split("@")[0])


def _why_low(c: Cell) -> str:
    """What a cosine below its target compares with: the quantized model's own (before lowering) and stock's .pte."""
    seen = []
    if c.edgeplug.quantized_cosine is not None:
        seen.append(f"the quantized model itself, before lowering: {c.edgeplug.quantized_cosine:.4f}")
    if c.stock.cosine_to_float is not None:
        seen.append(f"stock's .pte: {c.stock.cosine_to_float:.4f}")
    return f" ({'; '.join(seen)})" if seen else ""


def _tried(cells: list[Cell], side: Any, error: Any) -> str:
    """'lowers', 'fails at STAGE (first error)', or how many of each: one side of the cells of a borrowed scheme."""
    ok = [c for c in cells if side(c).ok]
    failed = [c for c in cells if not side(c).ok]
    if not failed:
        return "lowers" if len(cells) == 1 else f"lowers all {len(cells)}"
    first = failed[0]
    why = f"fails at {side(first).stage or 'lower'} ({_esc(error(first))[:200]})"
    if not ok:
        return why if len(cells) == 1 else f"{why} on all {len(cells)}"
    return f"lowers {len(ok)} of {len(cells)}; {why} on {', '.join(c.label for c in failed)}"


def quantized_targets(cells: list[Cell]) -> list[str]:
    """Issue 22's "done when" on the quantized cells, one line each: met or not, with the figures."""
    cells = [_settled(c) for c in cells if c.scheme != FLOAT]
    out: list[str] = []
    borrowed = [c for c in cells if "@" in c.scheme]  # a scheme the backend does not offer, tried
    cells = [c for c in cells if "@" not in c.scheme]
    ok = [c for c in cells if not c.error and c.edgeplug.ok]
    fails = [f"{c.label} {c.backend} {c.scheme} ({c.edgeplug.stage or 'cell'})" for c in cells if c not in ok]
    out.append(f"every cell of a scheme its backend offers lowers with edgeplug: {len(ok)} of {len(cells)}"
               + (f"; fails: {', '.join(fails)}" if fails else "") + f" — {'met' if not fails else 'not met'}")
    tried: dict[tuple[str, str], list[Cell]] = {}
    for c in borrowed:
        tried.setdefault((c.backend, c.scheme), []).append(c)
    for (backend, scheme), cs in tried.items():
        name, _, owner = scheme.partition("@")
        out.append(f"{backend} does not offer {owner}'s {name}; tried on {', '.join(c.label for c in cs)}: edgeplug "
                   + _tried(cs, lambda c: c.edgeplug, lambda c: c.edgeplug.error or c.error)
                   + ", stock " + (cs[0].stock_absent if all(c.stock_absent for c in cs)
                                   else _tried(cs, lambda c: c.stock, lambda c: c.stock.error)))
    stock_fails = [c for c in cells if not c.stock_absent and not c.stock.ok and c.stock.error]
    if stock_fails:
        by_stage: dict[str, list[str]] = {}
        for c in stock_fails:
            by_stage.setdefault(c.stock.stage or "lower", []).append(f"{c.label} {c.backend} {c.scheme}")
        out.append("stock fails on " + "; ".join(f"{len(v)} at {k} ({', '.join(v)})" for k, v in by_stage.items())
                   + ", each with its reason in the table")
    for family, bound in COSINE_TARGETS.items():
        cs = [c for c in ok if _cosine_target(c.scheme) == bound and c.scheme.split("-")[0] == family
              and c.edgeplug.cosine_to_float is not None]
        if not cs:
            continue
        low = [f"{c.label} {c.backend} {c.scheme} {c.edgeplug.cosine_to_float:.4f}{_why_low(c)}" for c in cs if c.edgeplug.cosine_to_float < bound]
        worst = min(c.edgeplug.cosine_to_float for c in cs)
        out.append(f"{family} cosine to float ≥ {bound} on {len(cs) - len(low)} of {len(cs)} (lowest {worst:.4f})"
                   + (f"; below: {', '.join(low)}" if low else "") + f" — {'met' if not low else 'not met'}")
    timed = [c for c in cells if c.latency_ratio is not None]
    if timed:
        slow = [f"{c.label} {c.scheme} {c.latency_ratio:.2f}×" for c in timed if c.latency_ratio > LATENCY_TARGET]
        ratios = sorted(c.latency_ratio for c in timed)
        out.append(f".pte latency ≤ {LATENCY_TARGET}× stock's on {len(timed) - len(slow)} of {len(timed)} cells where "
                   f"stock lowers (median {ratios[len(ratios) // 2]:.2f}×)" + (f"; above: {', '.join(slow)}" if slow else "")
                   + f" — {'met' if not slow else 'not met'}")
    sized = [c for c in cells if c.size_ratio is not None]
    if sized:
        big = [f"{c.label} {c.backend} {c.scheme} {c.size_ratio:.2f}×" for c in sized if c.size_ratio > SIZE_TARGET]
        out.append(f".pte size ≤ {SIZE_TARGET}× stock's on {len(sized) - len(big)} of {len(sized)} cells where stock lowers"
                   + (f"; above: {', '.join(big)}" if big else "") + f" — {'met' if not big else 'not met'}")
    return out


def render_quantized(cells: list[Cell], command: str, jobs: int, seconds: float, layers: Optional[int] = None,
                     notes: Optional[list[str]] = None) -> str:
    """docs/zoo.md's quantized section: how it was made, issue 22's targets, then a row per quantized cell."""
    cells = [_settled(c) for c in cells if c.scheme != FLOAT]
    lines = _quantized_heading(cells, command, jobs, seconds, layers)
    lines += ["### Against issue 22's targets", ""]
    lines += [f"- {line}" for line in quantized_targets(cells)]
    lines += [f"- {note}" for note in notes or []]
    lines += ["", *_quantized_rows(cells), "", QUANTIZED_END]
    return "\n".join(lines) + "\n"


def _quantized_heading(cells: list[Cell], command: str, jobs: int, seconds: float, layers: Optional[int]) -> list[str]:
    """The quantized section's opening: the command, the versions, what each side runs, what each column means."""
    import torch  # torch: the zoo's CLI starts (and parses its arguments) without it

    lines: list[str] = [QUANTIZED_BEGIN, "", "## Quantized: each backend's schemes beside stock executorch's flow", ""]
    add = lines.append
    add("Generated by (from the repository root; `make zoo` runs it after the float cells):")
    add("")
    add("```")
    add(command)
    add("```")
    add("")
    add(f"torch {torch.__version__}, executorch {version('executorch')}, torchao {version('torchao')}, "
        f"{os.cpu_count()} CPUs, {jobs} cell{'s' if jobs > 1 else ''} at a time; {len(cells)} cells in "
        f"{seconds / 60:.1f} min. Models as above ({layers or 2} layer{'s' if (layers or 2) > 1 else ''}, hidden 64).")
    add("")
    add("Both sides start from the same float model in the same process, with the same quantizer:")
    add("")
    add("- **edgeplug**: `edgeplug.quantize(model, inputs, backend, scheme)` (constant-only subgraphs folded and "
        "the backend's rewrites applied before annotation), `edgeplug.lower`, `edgeplug.verify` against the "
        "quantized model's eager output;")
    add("- **stock**: PT2E schemes: `torch.export`, `prepare_pt2e(ep.module(), Q)` with the scheme's own quantizer "
        "Q, one calibration call, `convert_pt2e`, export again; torchao schemes (8da4w, w4-g32, e4, ...): "
        "`quantize_(copy, config)` with the scheme's own config, then `torch.export`. Then "
        "`to_edge_transform_and_lower(partitioner=[P()])` and `.to_executorch()`, P the backend's partitioner.")
    add("")
    add("Columns: where a side fails, the stage it stopped at and the first line of its error; **partitions / "
        "CPU nodes**; **cosine** and **max |q − float|** of the logits against the float model's (xnnpack: each "
        ".pte in executorch's runtime; vulkan, webgpu: edgeplug's program on the host kernels, stock's cannot run "
        "here), then after the semicolon the quantized model's own eager logits against the float model's (what the "
        "scheme costs on this model before any lowering); **.pte** size in KiB (edgeplug / stock); **latency**: median forward time of the .pte in "
        "executorch's runtime on one thread (15 rounds of 20 calls, the two sides alternating), ratio to stock. "
        "`SCHEME@OWNER` lowers another backend's scheme (its quantizer) for this backend.")
    add("")
    return lines


def _quantized_rows(cells: list[Cell]) -> list[str]:
    """The quantized table: a row per cell, both sides."""
    lines: list[str] = []
    add = lines.append
    add("| model | backend | scheme | edgeplug | stock | partitions / CPU nodes (edgeplug vs stock) | cosine to float "
        "(edgeplug / stock; the quantized model's own) | max \\|q − float\\| (edgeplug / stock) | .pte KiB (edgeplug vs stock) | latency ms, edgeplug (/ stock) |")
    add("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for c in cells:
        if c.error:
            add(f"| {c.label} | {c.backend} | {c.scheme} | **fails**: {_esc(c.error)} | | | | | | |")
            continue
        e, s = c.edgeplug, c.stock
        stock = c.stock_absent if c.stock_absent else _lowers(s)
        pc = f"{_pc(e) if e.ok else '—'} vs {_pc(s) if s.ok else '—'}"
        kib = lambda b: None if b is None else b / 1024  # noqa: E731
        size = _pair(kib(e.pte_bytes), kib(s.pte_bytes), ".1f").replace(" / ", " vs ") + (f" ({c.size_ratio:.2f}×)" if c.size_ratio else "")
        latency = _ratio(e.latency_ms, c.latency_ratio, ".4f")
        add(f"| {c.label} | {c.backend} | {c.scheme} | {_lowers(e, c.dry_run)} | {stock} | {pc} "
            f"| {_pair(e.cosine_to_float, s.cosine_to_float, '.4f')}{_own(e)} | {_pair(e.max_abs_float, s.max_abs_float, '.3f')} "
            f"| {size} | {latency} |")
    return lines


def _own(side: Side) -> str:
    return f"; {side.quantized_cosine:.4f}" if side.quantized_cosine is not None else ""


def is_zoo_page(text: str) -> bool:
    """``text`` is a page ``render`` or ``render_quantized`` wrote (so a run may rewrite it)."""
    return text.startswith(PAGE_TITLE) or (QUANTIZED_BEGIN in text and QUANTIZED_END in text)


def splice_quantized(existing: str, section: str) -> str:
    """``existing`` (docs/zoo.md) with its quantized section replaced by ``section`` (appended if it has none)."""
    if QUANTIZED_BEGIN in existing and QUANTIZED_END in existing:
        head, rest = existing.split(QUANTIZED_BEGIN, 1)
        tail = rest.split(QUANTIZED_END, 1)[1]
        return head + section.rstrip("\n") + tail
    return existing.rstrip("\n") + "\n\n" + section
