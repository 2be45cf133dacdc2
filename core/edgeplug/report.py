"""LoweringReport: what a lowering did, as a table for people and JSON for tools."""

from __future__ import annotations

import json
from collections import Counter
from typing import Optional

from pydantic import BaseModel, Field

from edgeplug.records import FusionRecord


class StageTiming(BaseModel):
    stage: str
    seconds: float


class PartitionSummary(BaseModel):
    tag: str
    backend_id: str
    nodes: int
    ops: dict[str, int]


class CpuNode(BaseModel):
    node: str
    op: str
    reason: str


class OutputCheck(BaseModel):
    output: int
    max_abs_diff: float
    shape: list[int]


class Verification(BaseModel):
    method: str  # "pte" (executorch runtime) or "kernels" (host kernels on a wgpu adapter)
    adapter: Optional[str] = None
    outputs: list[OutputCheck] = Field(default_factory=list)
    note: str = ""

    @property
    def max_abs_diff(self) -> float:
        return max((o.max_abs_diff for o in self.outputs), default=0.0)


class LoweringReport(BaseModel):
    model: str
    backend: str
    distribution: str
    dry_run: bool = False
    stages: list[StageTiming] = Field(default_factory=list)
    partitions: list[PartitionSummary] = Field(default_factory=list)
    delegated_ops: dict[str, int] = Field(default_factory=dict)
    cpu_ops: dict[str, int] = Field(default_factory=dict)
    cpu_nodes: list[CpuNode] = Field(default_factory=list)
    #: ops kept whole before decomposition that were not delegated (a lowering defect)
    kept_whole_on_cpu: list[CpuNode] = Field(default_factory=list)
    #: skip-table ops the backend would not take at that node, so they were decomposed
    decomposed_instead: list[CpuNode] = Field(default_factory=list)
    fusions: list[FusionRecord] = Field(default_factory=list)
    output_path: Optional[str] = None
    output_bytes: Optional[int] = None
    verification: Optional[Verification] = None
    notes: list[str] = Field(default_factory=list)

    @property
    def delegated_nodes(self) -> int:
        return sum(self.delegated_ops.values())

    @property
    def cpu_node_count(self) -> int:
        return sum(self.cpu_ops.values())

    def to_json(self, indent: int = 2) -> str:
        data = self.model_dump(mode="json")
        data["summary"] = {
            "partitions": len(self.partitions),
            "delegated_nodes": self.delegated_nodes,
            "cpu_nodes": self.cpu_node_count,
            "max_abs_diff": self.verification.max_abs_diff if self.verification else None,
        }
        return json.dumps(data, indent=indent)

    def to_table(self) -> str:
        lines: list[str] = []
        add = lines.append
        mode = " (dry run: nothing serialized)" if self.dry_run else ""
        add(f"edgeplug lowering report: {self.model} -> {self.backend} [{self.distribution}]{mode}")
        add("")
        add("stages")
        for s in self.stages:
            add(f"  {s.stage:<24} {s.seconds:8.2f} s")
        add(f"  {'total':<24} {sum(s.seconds for s in self.stages):8.2f} s")
        add("")
        verb = "would delegate" if self.dry_run else "delegated"
        add(f"partitions: {len(self.partitions)} ({verb} {self.delegated_nodes} nodes)")
        for p in self.partitions:
            top = ", ".join(f"{k} x{v}" for k, v in sorted(p.ops.items(), key=lambda kv: -kv[1])[:6])
            more = "" if len(p.ops) <= 6 else f", ... ({len(p.ops)} op kinds)"
            add(f"  {p.tag:<20} {p.backend_id:<16} {p.nodes:4d} nodes: {top}{more}")
        add("")
        add(f"left on CPU (graph breaks): {self.cpu_node_count} nodes")
        for op, n in sorted(self.cpu_ops.items(), key=lambda kv: (-kv[1], kv[0])):
            reasons = sorted({c.reason for c in self.cpu_nodes if c.op == op})
            add(f"  {op:<40} x{n:<4} {'; '.join(reasons)}")
        if self.kept_whole_on_cpu:
            add(f"kept whole but left on CPU: {len(self.kept_whole_on_cpu)} nodes")
            for c in self.kept_whole_on_cpu:
                add(f"  {c.op:<40} {c.node}: {c.reason}")
        if self.decomposed_instead:
            add(f"decomposed instead of kept whole: {len(self.decomposed_instead)} nodes")
            for c in self.decomposed_instead:
                add(f"  {c.op:<40} {c.node}: {c.reason}")
        add("")
        outcomes = Counter(f.outcome for f in self.fusions)
        summary = ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items()))
        add(f"fusions: {len(self.fusions)}" + (f" ({summary})" if summary else ""))
        for f in self.fusions:
            extra = f": {f.reason}" if f.reason else ""
            eps = f" eps={f.eps:g}" if f.eps is not None else ""
            weight = f" weight={f.weight}" if f.weight else ""
            add(f"  {f.pattern:<9} {f.anchor:<28} {f.outcome}{eps}{weight}{extra}")
        if self.verification is not None:
            v = self.verification
            add("")
            where = f" on {v.adapter}" if v.adapter else ""
            add(f"verification ({v.method}{where}): max |difference| vs eager = {v.max_abs_diff:.3e}")
            for o in v.outputs:
                add(f"  output {o.output} {tuple(o.shape)}: {o.max_abs_diff:.3e}")
            if v.note:
                add(f"  note: {v.note}")
        add("")
        if self.output_path:
            add(f"wrote {self.output_path} ({self.output_bytes:,} bytes)")
        for n in self.notes:
            add(f"note: {n}")
        return "\n".join(lines)
