"""Canonicalizing rewrites of repeated work: the same pure op on the same inputs computed twice.

- ``merge_duplicates(ops=PURE)``: a call of one of ``ops`` whose target,
  arguments and keyword arguments are those of an earlier call (the same
  nodes, the same constants) is replaced by that earlier call. These ops
  read their inputs and write nothing, so the two compute the same value
  bit for bit. A decoder exported layer by layer repeats them: each layer's
  attention turns the one causal mask into ``-inf``/0 again (``where``), and
  the position arithmetic builds ``arange(0, seq)`` once per use. Merging
  runs to a fixed point (two adds of merged aranges merge in turn).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch.export import ExportedProgram

from edgeplug._graph.ops import op_name
from edgeplug._graph.rewrite import note_rewrite, replace_uses
from edgeplug._records import TransformRecord

#: ops that only read their inputs: merging two calls on the same inputs changes no value
PURE: tuple[str, ...] = (
    "aten.where.self", "aten.arange.start_step", "aten.arange.default", "aten.add.Tensor", "aten.sub.Tensor",
    "aten.mul.Tensor", "aten.unsqueeze_copy.default", "aten.view_copy.default", "aten.scalar_tensor.default",
    "aten.le.Tensor", "aten.lt.Tensor", "aten.ge.Tensor", "aten.gt.Tensor", "aten.eq.Tensor", "aten.expand_copy.default",
    "aten.slice_copy.Tensor", "aten.select_copy.int", "aten.sym_size.int", "dim_order_ops._to_dim_order_copy.default",
)


def _key(value: Any) -> Any:
    """A hashable key of an argument: nodes by identity, containers by their items, floats by their bits' repr."""
    if isinstance(value, torch.fx.Node):
        return ("node", id(value))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _key(v)) for k, v in value.items())))
    if isinstance(value, float):
        return ("float", repr(value))  # -0.0 and 0.0, nan: kept apart
    if isinstance(value, (bool, int, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return (type(value).__name__, value)
    return ("other", id(value))  # anything else merges only with itself


def merge_duplicates(ep: ExportedProgram, *, ops: Sequence[str] = PURE) -> list[TransformRecord]:
    """A call of one of ``ops`` repeating an earlier one (same target, args, kwargs) -> that earlier call."""
    wanted = set(ops)
    graph = ep.graph_module.graph
    records = []
    changed = True
    while changed:
        changed = False
        seen: dict[Any, torch.fx.Node] = {}
        for node in list(graph.nodes):
            if node.op != "call_function" or op_name(node) not in wanted:
                continue
            key = (id(node.target), _key(node.args), _key(node.kwargs))
            first = seen.setdefault(key, node)
            if first is node or any(u.op == "output" for u in node.users):
                continue
            replace_uses(ep, node, first)
            graph.erase_node(node)
            records.append(note_rewrite("merge_duplicates", node, 0, f"the same {op_name(node)} as {first.name}: reads it"))
            changed = True
    return records


__all__ = ["PURE", "merge_duplicates"]
