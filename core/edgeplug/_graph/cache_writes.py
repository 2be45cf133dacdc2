"""Cache writes left on the CPU, made fit for executorch's in-place ``index_put_`` before serialization.

executorch's reinplace pass turns every functional ``index_put`` it safely can
into ``index_put_``, whose kernel (the portable one) takes only one form: one
1-D integer index, no accumulate, and ``values`` of exactly the indexed shape
(the input's shape with the indexed dimension's size replaced by the index's
length). ``cache[:, :, pos] = k`` does not give that form: torch's
``__setitem__`` drops the leading 1s of ``k`` (executorch's own Llama writes a
``[4, 8, 16]`` value into a ``[1, 4, 64, 16]`` cache), which the functional op
broadcasts and the in-place kernel refuses at run time (``0x12``,
InvalidArgument). ``values_at_indexed_shape`` gives such values their leading
1s back (``unsqueeze_copy``), so the write can be made in place, and says when
a write cannot be (its values really broadcast), so the caller leaves every
write functional. Imports executorch only inside its function.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.export import ExportedProgram
from torch.fx.experimental.symbolic_shapes import statically_known_true

from edgeplug._graph.ops import edge_ops, op_name
from edgeplug._records import TransformRecord

INDEX_PUT = "aten.index_put.default"
TRANSFORM = "cache_write_values_at_indexed_shape"


def _statically_equal(a: Any, b: Any) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return bool(statically_known_true(a == b))


def _indexed_shape(node: torch.fx.Node) -> Optional[list[Any]]:
    """The shape in-place ``index_put_`` needs its values to have, or None when the write is not of the one
    form its kernel takes (one 1-D integer index tensor, no accumulate)."""
    target, indices = node.args[0], node.args[1]
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    given = target.meta.get("val") if isinstance(target, torch.fx.Node) else None
    if accumulate or not isinstance(given, torch.Tensor) or len(indices) > given.dim():
        return None
    present = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(present) != 1:
        return None
    dim, index = present[0]
    index_val = index.meta.get("val") if isinstance(index, torch.fx.Node) else None
    if not isinstance(index_val, torch.Tensor) or index_val.dim() != 1:
        return None
    if index_val.dtype not in (torch.int64, torch.int32):
        return None
    shape = list(given.shape)
    shape[dim] = index_val.shape[0]
    return shape


def _leading_ones(values: torch.Tensor, shape: list[Any]) -> Optional[int]:
    """How many leading 1s ``values`` lacks to have ``shape`` (0 when it has it), or None when it is not
    ``shape`` less some leading 1s (its values broadcast)."""
    missing = len(shape) - values.dim()
    if missing < 0 or any(not _statically_equal(s, 1) for s in shape[:missing]):
        return None
    if all(_statically_equal(a, b) for a, b in zip(values.shape, shape[missing:])):
        return missing
    return None


def values_at_indexed_shape(ep: ExportedProgram) -> tuple[bool, list[TransformRecord]]:
    """Make each functional ``index_put`` of edge program ``ep`` one executorch's in-place ``index_put_`` runs.

    Returns ``(in_place, records)``: ``in_place`` is whether every ``index_put``
    may be made in place (executorch's reinplace pass makes all it safely can,
    so one write the in-place kernel cannot take means none may be: ``ep`` is
    then left as it was); ``records`` the writes whose values got their leading
    1s back, one ``unsqueeze_copy`` each (changes ``ep``'s graph in place, the
    values the same).
    """
    writes = [n for n in ep.graph_module.graph.nodes if n.op == "call_function" and op_name(n) == INDEX_PUT]
    plan: list[tuple[torch.fx.Node, int]] = []
    for node in writes:
        shape = _indexed_shape(node)
        values = node.args[2]
        val = values.meta.get("val") if isinstance(values, torch.fx.Node) else None
        missing = _leading_ones(val, shape) if shape is not None and isinstance(val, torch.Tensor) else None
        if missing is None:
            return False, []
        if missing:
            plan.append((node, missing))
    records = []
    graph = ep.graph_module.graph
    for node, missing in plan:
        values = node.args[2]
        with graph.inserting_before(node):
            full = values
            for _ in range(missing):
                full = graph.call_function(edge_ops().aten.unsqueeze_copy.default, (full, 0))
                full.meta["val"] = full.args[0].meta["val"].unsqueeze(0)
        node.replace_input_with(values, full)
        records.append(TransformRecord(
            transform=TRANSFORM, kind="rewrite", node=node.name, op=INDEX_PUT, removed=0, added=missing,
            detail=(
                f"values {list(values.meta['val'].shape)} given their {missing} leading 1"
                f"{'s' if missing > 1 else ''} back, so executorch's in-place index_put_ takes the write"
            ),
        ))
    if records:
        ep.graph_module.recompile()
    return True, records


__all__ = ["values_at_indexed_shape"]
