"""LoweringReport: what a lowering did, as a table for people and JSON for tools."""

from __future__ import annotations

import json
import math
import operator
import re
from collections import Counter
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

from pydantic import BaseModel, Field

from edgeplug._records import FusionRecord, TransformRecord
from edgeplug._terminal import terminal_safe


def _finite_or_null(value: Any, path: str, replaced: list[str]) -> Any:
    """``value`` with every non-finite float replaced by None; ``replaced`` collects their paths."""
    if isinstance(value, float) and not math.isfinite(value):
        replaced.append(f"{path or 'value'} ({value})")
        return None
    if isinstance(value, dict):
        return {k: _finite_or_null(v, f"{path}.{k}" if path else str(k), replaced) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_null(v, f"{path}[{i}]", replaced) for i, v in enumerate(value)]
    return value


class StageTiming(BaseModel):
    stage: str
    seconds: float
    #: the process's peak resident MiB during the stage (``profile_memory``; None when not profiled)
    peak_rss_mib: Optional[float] = None


class PartitionSummary(BaseModel):
    tag: str
    backend_id: str
    nodes: int
    ops: dict[str, int]


class CpuNode(BaseModel):
    node: str
    op: str
    reason: str


class GraphNode(BaseModel):
    """One node of the partitioned edge graph, as the HTML page and Model Explorer draw it."""

    name: str
    #: the op (``aten.mm.default``), or ``input`` / ``output``
    op: str
    #: the names of the nodes it reads
    inputs: list[str] = Field(default_factory=list)
    shape: str = ""
    dtype: str = ""
    #: the module it came from (``blocks.0.attn``), "" when none
    module: str = ""
    #: the partition it went to (the report's ``partitions[].tag``); "" on the CPU or for inputs/outputs
    partition: str = ""
    #: why a call node stayed on the CPU
    reason: str = ""
    #: the fusion or transform that made or touched it
    fusion: str = ""


class Partitioning(BaseModel):
    """How a program's graph is split between a backend's partitions and the CPU: the one record
    edgeplug's own lowering (``LoweringReport``) and the stock flow (``StockPartitioning``) both are."""

    partitions: list[PartitionSummary] = Field(default_factory=list)
    #: op -> how many nodes of it the partitions took
    delegated_ops: dict[str, int] = Field(default_factory=dict)
    #: op -> how many nodes of it were left on the CPU
    cpu_ops: dict[str, int] = Field(default_factory=dict)
    #: each node left on the CPU, with why
    cpu_nodes: list[CpuNode] = Field(default_factory=list)
    #: the partitioned edge graph, node by node (what ``--report X.html`` and ``--explore`` draw)
    graph: list[GraphNode] = Field(default_factory=list)

    @property
    def delegated_nodes(self) -> int:
        return sum(self.delegated_ops.values())

    @property
    def cpu_node_count(self) -> int:
        return sum(self.cpu_ops.values())


class StockPartitioning(Partitioning):
    """How the backend's own executorch partitioner splits the same model (``--compare-stock``)."""

    flow: str
    #: why there is no stock partitioning (the flow failed, or the backend has none)
    error: str = ""


class OutputCheck(BaseModel):
    """One output (or mutated input/buffer) of a verified program against its reference."""

    output: int
    #: what was compared when it is not a plain output, e.g. "input 'x' (mutated in place)"
    name: str = ""
    max_abs_diff: float
    shape: list[int]
    dtype: str = ""
    #: the max |difference| accepted, and why that value (given, or the default for the dtype)
    tolerance: Optional[float] = None
    tolerance_reason: str = ""
    #: NaN/inf values at the same positions in both (these compare equal)
    nonfinite_matched: int = 0
    #: why this output fails (empty: it passes)
    problems: list[str] = Field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    @property
    def label(self) -> str:
        return self.name or f"output {self.output}"


class GreedyCheck(BaseModel):
    """Greedy generation through the lowered program against eager (``verify_steps``): the token ids of
    each, the first step where they differ, and eager's logit margin (top-1 minus top-2) there.

    Step 0 is the token the prefill call gives; step k the k-th one-token decode step. A difference
    passes only as a near-tie: the two sides' logits at that step (same tokens before it) within the
    verification's tolerance, and the margin no larger than twice their largest difference.
    """

    #: tokens asked for
    steps: int
    #: the example prompt's length (the prefill call's tokens)
    prompt_tokens: int = 0
    #: what the ids are compared with: "eager", or "the quantized model"
    reference: str = "eager"
    lowered_ids: list[int] = Field(default_factory=list)
    reference_ids: list[int] = Field(default_factory=list)
    #: the first step whose ids differ, or None
    first_difference: Optional[int] = None
    #: eager's top-1 minus top-2 logit at ``first_difference``
    margin: Optional[float] = None
    #: max |lowered - eager| of the logits at ``first_difference``
    logits_max_abs_diff: Optional[float] = None
    #: the difference is a near-tie broken by rounding (see the class docstring)
    tie: bool = False
    #: whether all ``steps`` tokens were generated on both sides
    ran: bool = False
    #: why generation did not run or stopped (the check then fails)
    reason: str = ""
    #: what ran the lowered program's side: the backend's own runtime and its adapter, executorch's runtime,
    #: or the host emulation (and why the backend's own runtime did not)
    runner: str = ""

    @property
    def passed(self) -> bool:
        return self.ran and (self.first_difference is None or self.tie)

    def summary(self) -> str:
        on = f" (ran on {self.runner})" if self.runner else ""
        if not self.ran:
            return f"greedy {self.steps} tokens: not checked: {self.reason}{on}"
        head = f"greedy {self.steps} tokens after a {self.prompt_tokens}-token prompt vs {self.reference}"
        if self.first_difference is None:
            return f"{head}: all {self.steps} ids agree{on}"
        verdict = "a near-tie broken differently" if self.tie else "FAILED"
        return (
            f"{head}: first differs at step {self.first_difference} (lowered {self.lowered_ids[self.first_difference]}, "
            f"{self.reference} {self.reference_ids[self.first_difference]}), margin {self.margin:.4g}, "
            f"logits max |difference| there {self.logits_max_abs_diff:.3g}: {verdict}{on}"
        )


class Verification(BaseModel):
    """``edgeplug.verify``'s answer: each output of the lowered program compared with eager."""

    method: str  # "pte" (executorch runtime) or "kernels" (host kernels on a wgpu adapter)
    adapter: Optional[str] = None
    outputs: list[OutputCheck] = Field(default_factory=list)
    note: str = ""
    #: greedy generation compared token for token (``verify_steps``), where asked for
    greedy: Optional[GreedyCheck] = None

    @property
    def max_abs_diff(self) -> float:
        return max((o.max_abs_diff for o in self.outputs), default=0.0)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs) and (self.greedy is None or self.greedy.passed)

    def failures(self) -> list[str]:
        """One line per failing output: what it is and why it fails (and the greedy check's, where it fails)."""
        lines = [f"{o.label}: {'; '.join(o.problems)}" for o in self.outputs if o.problems]
        if self.greedy is not None and not self.greedy.passed:
            lines.append(self.greedy.summary())
        return lines


class QuantizationSummary(BaseModel):
    """The report's account of a quantized program: whose quantizer, what it did, how it verified."""

    #: the backend whose quantizer produced the program (may differ from the lowering's)
    quantizer_backend: str
    scheme: str
    description: str = ""
    activation_bits: Optional[int] = None
    weight_bits: Optional[int] = None
    per_channel: Optional[bool] = None
    distribution: str = ""
    #: "pt2e" or "source_transform" (torchao's quantize_ on a copy of the model; no calibration)
    kind: str = "pt2e"
    calibration_batches: int = 0
    #: the cap on calibration batches, and whether the calibration data had more than it (they were not read)
    calibration_limit: int = 0
    calibration_cut: bool = False
    #: RMSNorms recomposed before annotation (``fused``/``folded_weight``) or refused, with why
    norms: list[FusionRecord] = Field(default_factory=list)
    #: constant-only subgraphs folded before annotation (``fold`` records; refusals say why)
    folds: list[TransformRecord] = Field(default_factory=list)
    #: nodes dropped before annotation because they compute nothing (metadata asserts, casts to the same dtype)
    rewrites: list[TransformRecord] = Field(default_factory=list)
    #: decomposed RMSNorms whose arithmetic stayed float (the backend has no norm op; its quantizer would round inside)
    float_norms: list[str] = Field(default_factory=list)
    #: layers the scheme left float, each with why (a source transform's group size does not divide its width)
    kept_float: list[str] = Field(default_factory=list)
    #: set when the program was quantized for another backend than the one it is lowered for
    foreign: bool = False
    #: what verification compared with, and per output |lowered - quantized| and |lowered - float|
    reference: str = ""
    versus_quantized: list[float] = Field(default_factory=list)
    versus_float: list[float] = Field(default_factory=list)
    #: per output, the cosine similarity of the lowered program's output and the float model's (1.0: same direction)
    cosine_to_float: list[float] = Field(default_factory=list)
    #: per output, the same for the quantized model's eager output: what the scheme costs before any lowering
    #: (the lowered program's figure falling well below it is the lowering's cost)
    quantized_cosine_to_float: list[float] = Field(default_factory=list)

    def table_lines(self) -> list[str]:
        bits = f"{self.activation_bits}-bit activations" if self.activation_bits else "float activations"
        what = f"{bits}, {self.weight_bits}-bit {'per-channel' if self.per_channel else 'per-tensor'} weights"
        batches = f"{self.calibration_batches} calibration batch{'es' if self.calibration_batches != 1 else ''}"
        if self.calibration_cut:
            batches += f", the first {self.calibration_limit} of more (--calibration-batches)"
        if self.kind == "source_transform":
            what, batches = f"torchao source transform: {self.description}", "no calibration"
        lines = [f"quantization: {self.quantizer_backend} {self.scheme} ({what}; {batches})"]
        if self.foreign:
            lines.append(f"  quantized with {self.quantizer_backend}'s quantizer, not the target backend's")
        outcomes: dict[str, int] = {}
        for r in self.norms:
            outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
        if self.norms:
            told = ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items()))
            lines.append(f"  norms recomposed before annotation: {len(self.norms)} ({told})")
            lines.extend(f"    {r.anchor}: {r.reason}" for r in self.norms if r.outcome == "rejected")
        casts = [r for r in self.rewrites if r.transform == "drop_no_op_casts"]
        if casts:
            lines.append(f"  no-op casts and metadata checks dropped before annotation: {len(casts)}")
        lines.extend(f"  {r.node}: {r.detail}" for r in self.rewrites if r.transform != "drop_no_op_casts")
        if self.float_norms:
            lines.append(f"  norms whose arithmetic stayed float (no norm op on the backend): {len(self.float_norms)}")
        applied = [r for r in self.folds if r.outcome == "applied"]
        if self.folds:
            removed = sum(r.removed for r in applied)
            lines.append(
                f"  constant-only subgraphs folded before annotation: {len(applied)} ({removed} nodes removed)"
                + (f", {len(self.folds) - len(applied)} left as they were" if len(applied) < len(self.folds) else "")
            )
            lines.extend(f"    {r.node} ({r.op}): {r.detail}" for r in self.folds if r.outcome == "refused")
        if self.kept_float:
            lines.append(f"  layers kept float: {len(self.kept_float)}")
            lines.extend(f"    {why}" for why in self.kept_float)
        if self.reference:
            lines.append(f"  verification reference: {self.reference}")
        for i, q in enumerate(self.versus_quantized):
            versus_float = f", |lowered - float| = {self.versus_float[i]:.3e}" if i < len(self.versus_float) else ""
            if i < len(self.cosine_to_float):
                versus_float += f", cosine to float = {self.cosine_to_float[i]:.4f}"
                if i < len(self.quantized_cosine_to_float):
                    versus_float += f" (the quantized model's own: {self.quantized_cosine_to_float[i]:.4f})"
            lines.append(f"  output {i}: |lowered - quantized| = {q:.3e}{versus_float}")
        return lines


#: the key of a delegate's ``_delegate_info_meta`` (a dict, what its preprocess returned) that says the
#: delegate holds a stand-in payload, not a compiled program: ``{"reason": SENTENCE, "folder": PATH or None,
#: "kept": bool, "keep_hint": SENTENCE}`` (``folder``: where the stand-in preprocess recorded its work,
#: ``kept``: whether it outlives the process, ``keep_hint``: how to keep it)
STAND_IN_KEY = "edgeplug_stand_in"


class StandIn(BaseModel):
    """Why a lowering's program does not run: its delegates hold stand-in payloads, not compiled programs.

    Set for a dry run (edgeplug's stand-in preprocess) and for a backend whose preprocess stands in
    for the vendor's compiler (recording the SDK's calls instead of compiling). Such a program is never written under the
    requested name; ``LoweringResult.save(path, stand_in=True)`` writes it as ``STEM.stand-in.pte``.
    """

    #: "dry run": edgeplug's stand-in preprocess (``dry_run=True``); "backend": the backend's own
    #: preprocess put stand-ins in (``STAND_IN_KEY`` on its delegates)
    kind: Literal["dry run", "backend"]
    #: what the delegates hold instead of a compiled program, and who put it there
    reason: str
    #: delegates holding a stand-in payload
    delegates: int = 0
    #: the folder the stand-in preprocess recorded its work in (the SDK calls it recorded), if any
    recording: Optional[str] = None
    #: whether ``recording`` is kept after the process ends (asked for), else it is removed then
    recording_kept: bool = False
    #: how to keep ``recording`` (the backend's words), where it is not kept
    keep_hint: str = ""
    #: where the stand-in program was written (only when asked: ``--write-stand-in``), else None
    written: Optional[str] = None


def stand_in_path(path: Any) -> Any:
    """``x.pte`` -> ``x.stand-in.pte``: the only name a program with stand-in delegates is written under."""
    p = Path(path)
    if p.name.endswith(".stand-in.pte"):
        return p
    stem = p.name[: -len(".pte")] if p.name.endswith(".pte") else p.name
    return p.with_name(f"{stem}.stand-in.pte")


#: the version of the report's JSON layout this edgeplug writes and the newest it reads; raised when a
#: field changes meaning or is removed (a report without ``format_version`` is of format 1)
REPORT_FORMAT = 1

#: the report's fields its JSON opens with (the shared ``Partitioning`` fields would come first otherwise)
_JSON_HEAD = ("format_version", "model", "backend", "distribution", "dry_run", "stand_in", "stages")


class LoweringReport(Partitioning):
    """What a lowering did: partitions, ops on the CPU and why, fusions, transforms, timings, verification."""

    #: the layout of the JSON (``REPORT_FORMAT``); ``edgeplug report`` refuses a newer one
    format_version: int = REPORT_FORMAT
    model: str
    backend: str
    distribution: str
    #: true where no delegate holds a compiled program: a dry run, or a backend's stand-in preprocess
    #: (``stand_in`` says which and why); false only for a program that runs
    dry_run: bool = False
    #: set where the delegates hold stand-in payloads (the program does not run): why, and what was kept
    stand_in: Optional[StandIn] = None
    stages: list[StageTiming] = Field(default_factory=list)
    #: ops kept whole before decomposition that were not delegated (a lowering defect)
    kept_whole_on_cpu: list[CpuNode] = Field(default_factory=list)
    #: keep-whole ops the backend would not take at that node, so they were decomposed
    decomposed_instead: list[CpuNode] = Field(default_factory=list)
    fusions: list[FusionRecord] = Field(default_factory=list)
    #: What constant folding and canonicalizing rewrites changed, in order.
    transforms: list[TransformRecord] = Field(default_factory=list)
    output_path: Optional[str] = None
    output_bytes: Optional[int] = None
    verification: Optional[Verification] = None
    #: set for a quantized program: whose quantizer, the norms it saw, |lowered - quantized| and |lowered - float|
    quantization: Optional[QuantizationSummary] = None
    notes: list[str] = Field(default_factory=list)
    #: the stock executorch flow's partitioning of the same model (``--compare-stock``)
    stock: Optional[StockPartitioning] = None

    def to_json(self, indent: int = 2) -> str:
        """Strict JSON: a non-finite number is written as null, and a note says where."""
        data = self.model_dump(mode="json")
        data = {**{k: data[k] for k in _JSON_HEAD}, **data}  # who and what first, then the partitioning
        data["summary"] = {
            "partitions": len(self.partitions),
            "delegated_nodes": self.delegated_nodes,
            "cpu_nodes": self.cpu_node_count,
            "max_abs_diff": self.verification.max_abs_diff if self.verification else None,
            "verified": self.verification.passed if self.verification else None,
        }
        replaced: list[str] = []
        data = _finite_or_null(data, "", replaced)
        if replaced:
            data["notes"] = [*data["notes"], "non-finite numbers written as null (JSON has none): " + ", ".join(replaced)]
        return json.dumps(data, indent=indent, allow_nan=False)

    def to_table(self) -> str:
        lines = [*self._heading_lines(), *self._partition_lines(), *self._cpu_lines(), ""]
        if self.quantization is not None:
            lines += [*self.quantization.table_lines(), ""]
        lines += _fusion_lines(self.fusions)
        if self.transforms:
            lines += ["", *_transform_lines(self.transforms)]
        if self.verification is not None:
            lines += ["", *_verification_lines(self.verification)]
        lines.append("")
        if self.output_path:
            what = "the stand-in program " if self.stand_in is not None else ""
            lines.append(f"wrote {what}{self.output_path} ({self.output_bytes:,} bytes)")
        lines += [f"note: {n}" for n in self.notes]
        return terminal_safe("\n".join(lines))

    def _heading_lines(self) -> list[str]:
        """The title (what was lowered for which backend, and whether it runs), then the stage timings."""
        mode = " (dry run: nothing serialized)" if self.dry_run else ""
        if self.stand_in is not None and self.stand_in.kind == "backend":
            mode = " (stand-in delegates: this program does not run)"
        lines = [f"edgeplug lowering report: {self.model} -> {self.backend} [{self.distribution}]{mode}", "", "stages"]
        width = max([24, *(len(s.stage) for s in self.stages)])
        for s in self.stages:
            peak = f" {s.peak_rss_mib:9.0f} MiB peak" if s.peak_rss_mib is not None else ""
            lines.append(f"  {s.stage:<{width}} {s.seconds:8.2f} s{peak}")
        lines += [f"  {'total':<{width}} {sum(s.seconds for s in self.stages):8.2f} s", ""]
        return lines

    def _partition_lines(self) -> list[str]:
        verb = "would delegate" if self.dry_run else "delegated"
        lines = [f"partitions: {len(self.partitions)} ({verb} {self.delegated_nodes} nodes)"]
        for p in self.partitions:
            top = ", ".join(f"{k} x{v}" for k, v in sorted(p.ops.items(), key=lambda kv: -kv[1])[:6])
            more = "" if len(p.ops) <= 6 else f", ... ({len(p.ops)} op kinds)"
            lines.append(f"  {p.tag:<20} {p.backend_id:<16} {p.nodes:4d} nodes: {top}{more}")
        return [*lines, ""]

    def _cpu_lines(self) -> list[str]:
        """What stayed on the CPU and why, the stock flow's counts beside it, and keep-whole ops that went wrong."""
        lines = [f"left on CPU (graph breaks): {self.cpu_node_count} nodes"]
        for op, n in sorted(self.cpu_ops.items(), key=lambda kv: (-kv[1], kv[0])):
            by_reason = Counter(c.reason for c in self.cpu_nodes if c.op == op)
            if len(by_reason) <= 1:
                lines.append(f"  {op:<40} x{n:<4} {next(iter(by_reason), '')}".rstrip())
                continue
            # each reason on a line of its own, with how many of the op's nodes it holds (not one long line)
            lines.append(f"  {op:<40} x{n:<4} {len(by_reason)} reasons:")
            lines += [f"      x{k:<4} {reason}" for reason, k in sorted(by_reason.items(), key=lambda rk: (-rk[1], rk[0]))]
        if self.stock is not None:
            st = self.stock
            lines.append(
                f"stock executorch: {st.error}" if st.error else
                f"stock executorch ({st.flow}): {len(st.partitions)} partitions, {st.delegated_nodes} nodes "
                f"delegated, {st.cpu_node_count} on CPU"
            )
        for title, nodes in (("kept whole but left on CPU", self.kept_whole_on_cpu),
                             ("decomposed instead of kept whole", self.decomposed_instead)):
            if nodes:
                lines.append(f"{title}: {len(nodes)} nodes")
                lines += [f"  {c.op:<40} {c.node}: {c.reason}" for c in nodes]
        return lines


def _fusion_lines(fusions: list[FusionRecord]) -> list[str]:
    outcomes = Counter(f.outcome for f in fusions)
    summary = ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items()))
    lines = [f"fusions: {len(fusions)}" + (f" ({summary})" if summary else "")]
    for f in fusions:
        extra = f": {f.reason}" if f.reason else ""
        eps = f" eps={f.eps:g}" if f.eps is not None else ""
        weight = f" weight={f.weight}" if f.weight else ""
        lines.append(f"  {f.pattern:<9} {f.anchor:<28} {f.outcome}{eps}{weight}{extra}")
    return lines


def _verification_lines(v: Verification) -> list[str]:
    where = f" on {v.adapter}" if v.adapter else ""
    lines = [f"verification ({v.method}{where}): max |difference| vs eager = {v.max_abs_diff:.3e}"]
    for o in v.outputs:
        tol = f" (tolerance {o.tolerance:.3e}, {o.tolerance_reason})" if o.tolerance is not None else ""
        verdict = f" FAILED: {'; '.join(o.problems)}" if o.problems else ""
        lines.append(f"  {o.label} {tuple(o.shape)}: {o.max_abs_diff:.3e}{tol}{verdict}")
    if v.note:
        lines.append(f"  note: {v.note}")
    if v.greedy is not None:
        lines.append(f"  {v.greedy.summary()}")
    return lines


def _module_path(node: Any) -> str:
    """The module a node came from (``blocks.0.attn``), from torch.export's ``nn_module_stack``."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = str(list(stack.values())[-1][0])
    if not path.startswith("L['self']"):  # torch.export's own form, the model's names as they are
        return path
    # dynamo's source form (L['self'].blocks[0]._modules['attn']), from older exports
    path = path.replace("L['self'].", "").replace("L['self']", "")
    return re.sub(r"\[(\d+)\]", r".\1", path).replace("['", ".").replace("']", "").strip(".")


def _shape_and_dtype(val: Any) -> tuple[str, str]:
    vals = val if isinstance(val, (tuple, list)) else [val]
    shapes, dtypes = [], []
    for v in vals:
        if hasattr(v, "shape") and hasattr(v, "dtype"):
            shapes.append("[" + ", ".join(str(d) for d in v.shape) + "]")
            dtypes.append(str(v.dtype).replace("torch.", ""))
    return ", ".join(shapes), ", ".join(dtypes)


def graph_nodes(gm: Any, user_inputs: Optional[set[str]] = None) -> list[GraphNode]:
    """The nodes of an fx graph as the page draws them: ``getitem`` nodes are folded into the node
    they read, placeholders are ``input`` (a user input) or ``weight`` (parameters, buffers, constants)."""
    from edgeplug._partition import op_name  # torch and executorch: the CLI reads reports without them

    alias: dict[str, str] = {}
    out: list[GraphNode] = []
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is operator.getitem and n.args and hasattr(n.args[0], "name"):
            alias[n.name] = alias.get(n.args[0].name, n.args[0].name)
            continue
        if n.op == "placeholder":
            op = "input" if user_inputs is None or n.name in user_inputs else "weight"
        elif n.op == "output":
            op = "output"
        elif n.op == "call_function":
            op = op_name(n.target)
        else:
            continue  # get_attr: a submodule or constant, drawn through its readers
        inputs = list(dict.fromkeys(alias.get(a.name, a.name) for a in n.all_input_nodes if a.op != "get_attr"))
        shape, dtype = _shape_and_dtype(n.meta.get("val"))
        out.append(GraphNode(name=n.name, op=op, inputs=inputs, shape=shape, dtype=dtype, module=_module_path(n)))
    return out


def annotate_graph(
    nodes: list[GraphNode], partition_of: dict[str, str], cpu_reasons: dict[str, str],
    fusions: Sequence[FusionRecord] = (), transforms: Sequence[TransformRecord] = (),
) -> list[GraphNode]:
    """``nodes`` with each call node's partition (``partition_of``: node name -> tag) or CPU reason,
    and the fusion or transform records that name it (a fused op is matched to the fused records
    of its pattern in graph order)."""
    notes: dict[str, list[str]] = {}
    for f in fusions:
        if f.outcome == "rejected":
            notes.setdefault(f.anchor, []).append(_fusion_text(f))
    fused = [f for f in fusions if f.outcome != "rejected"]
    for t in transforms:
        detail = f": {t.detail}" if t.detail else ""
        notes.setdefault(t.node, []).append(f"{t.transform} ({t.kind}) {t.outcome}{detail}")
    out = []
    for n in nodes:
        extra: dict[str, Any] = {}
        if n.op not in ("input", "weight", "output"):
            tag = partition_of.get(n.name, "")
            extra["partition"] = tag
            if not tag:
                extra["reason"] = cpu_reasons.get(n.name, "")
            made = [next(iter(fused))] if fused and fused[0].pattern in n.op else []
            if made:
                fused.pop(0)
            text = [_fusion_text(f) for f in made] + notes.get(n.name, [])
            if text:
                extra["fusion"] = "; ".join(text)
        out.append(n.model_copy(update=extra) if extra else n)
    return out


def _fusion_text(f: FusionRecord) -> str:
    eps = f" eps={f.eps:g}" if f.eps is not None else ""
    weight = f" weight={f.weight}" if f.weight else ""
    why = f": {f.reason}" if f.reason else ""
    return f"{f.pattern} fusion at {f.anchor}: {f.outcome}{eps}{weight}{why}"


def _transform_lines(records: list[TransformRecord]) -> list[str]:
    """Per transform: one line for what it did (summed), then one per record."""
    lines = []
    by_name: dict[str, list[TransformRecord]] = {}
    for r in records:
        by_name.setdefault(r.transform, []).append(r)
    for name, rs in by_name.items():
        done = [r for r in rs if r.outcome == "applied"]
        removed, added, size = sum(r.removed for r in done), sum(r.added for r in done), sum(r.bytes_added for r in done)
        extra = f", {size:,} bytes of constants added" if size else ""
        refused = len(rs) - len(done)
        left = f"; {refused} left as they were" if refused else ""
        lines.append(f"{name} ({rs[0].kind}): {len(done)} applied, {removed} nodes removed, {added} added{extra}{left}")
        for r in rs:
            detail = f": {r.detail}" if r.detail else ""
            mark = "left " if r.outcome == "refused" else ""
            lines.append(f"  {mark}{r.op:<40} {r.node}{detail}")
    return lines


def graph_of(ep: Any) -> list[GraphNode]:
    """``graph_nodes`` of an ExportedProgram, its user inputs told apart from its weights."""
    users = {s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"}
    return graph_nodes(ep.graph_module, users)
