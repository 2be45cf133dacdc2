"""What a lowering delegated, read from the lowered program for the report: partitions and their
ops, the nodes left on the CPU with their reasons, each node's partition, passes from other plugins."""

from __future__ import annotations

import operator
from collections import Counter
from typing import AbstractSet, Any, Optional

import torch
from executorch.exir.lowered_backend_module import get_lowered_submodules
from torch.export import ExportedProgram

from edgeplug._backend import Backend
from edgeplug._graph.ops import op_name
from edgeplug._partition.standin import STAND_IN_ID
from edgeplug._report.records import CpuNode, PartitionSummary

def count_delegated(edge_ep: ExportedProgram, backend_id: Optional[str] = None) -> tuple[list[PartitionSummary], Counter]:
    """Partitions and delegated ops read from the lowered graph (a dry run's stand-in delegates
    are named ``backend_id``, the backend they stand in for)."""
    parts: list[PartitionSummary] = []
    total: Counter = Counter()
    for name, lowered, _node in get_lowered_submodules(edge_ep.graph_module):
        ops: Counter = Counter()
        for n in lowered.original_module.graph_module.graph.nodes:
            if n.op == "call_function" and n.target is not operator.getitem:
                ops[op_name(n)] += 1
        total.update(ops)
        real_id = backend_id if lowered.backend_id == STAND_IN_ID and backend_id else lowered.backend_id
        parts.append(PartitionSummary(tag=name, backend_id=real_id, nodes=sum(ops.values()), ops=dict(ops)))
    return parts, total


def cpu_nodes(gm: torch.fx.GraphModule, reasons: dict[str, str], default: str, tagged: AbstractSet[str] = frozenset()) -> list[CpuNode]:
    """The graph's ops left to executorch's CPU kernels, each with its reason (``default`` where none was recorded)."""
    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        if "executorch_call_delegate" in str(n.target) or n.name in tagged:
            continue
        out.append(CpuNode(node=n.name, op=op_name(n), reason=reasons.get(n.name, default)))
    return out


def partitions(p: Any, edge_ep: ExportedProgram, backend: str) -> tuple[list[PartitionSummary], Counter, list[CpuNode]]:
    """The lowered program's partitions, delegated ops, and CPU nodes each with the reason ``p`` (the
    core's partitioner) recorded for it."""
    default_reason = f"no reason recorded by the {backend} partitioner"
    # read from the lowered graph, dry run or not: a dry run lowers the same partitions to a stand-in
    real_ids = {r.backend_id for r in p.partitions}
    parts, delegated = count_delegated(edge_ep, next(iter(real_ids)) if len(real_ids) == 1 else None)
    return parts, delegated, cpu_nodes(edge_ep.graph_module, p.cpu_reasons, default_reason)


def foreign_passes(b: Backend) -> list[str]:
    """Notes naming passes another plugin than the backend's own ran on this backend."""
    notes = []
    for spec in b.passes:
        origin = b.origin(spec)
        if origin is not None and origin != b.plugin:
            notes.append(f"{spec.stage}-stage pass {spec.name!r} on backend {b.name!r} came from {origin.describe()}, not from {b.distribution}")
    return notes


def partition_of(edge_ep: ExportedProgram, p: Any) -> dict[str, str]:
    """Node name -> its partition as the report names it: read from the lowered graph, or from the
    partitioner's (``p``) records where nothing was lowered."""
    where = lowered_partitions(edge_ep.graph_module)
    return where or {n: r.tag for r in p.partitions for n in r.nodes}


def lowered_partitions(gm: Any) -> dict[str, str]:
    """Node name -> the lowered module holding it (the report's partition tag), read from the
    lowered graph's delegates as the report's partition counts are."""
    where: dict[str, str] = {}
    for name, lowered, _node in get_lowered_submodules(gm):
        for n in lowered.original_module.graph_module.graph.nodes:
            if n.op == "call_function":
                where[n.name] = name
    return where
