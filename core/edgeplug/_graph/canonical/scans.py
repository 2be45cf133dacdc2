"""Canonicalizing rewrites of scans (a state-space layer's cumulative sums).

- ``short_cumsum_as_adds(max_length=2, dtypes=FLOATS)``: ``cumsum`` over a
  dim of length 1 or 2 -> ``y0 = x0 + 0``, ``y1 = y0 + x1`` (Mamba-2's
  chunk-level sum with one chunk scans two values). Eager sums in a wider
  type (float32 in double, float16 in float) from +0, then rounds:
  ``0 + x0`` is exact (and makes -0 +0, as eager does), and one sum of two
  values rounded twice, first to a type of at least twice the precision
  plus two bits, is the sum rounded once. A longer scan rounds after each
  add, which the wide sum does not: refused (``max_length`` cannot exceed 2).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch.export import ExportedProgram

from edgeplug._graph.canonical.base import FLOATS, slice_of
from edgeplug._graph.constants import lift_constant
from edgeplug._graph.rewrite import NodeBuilder, calls_to, is_plain, is_static, note_rewrite, tensor_of
from edgeplug._records import TransformRecord

# -- a scan of one or two values, as adds ------------------------------------------------------


def short_cumsum_as_adds(
    ep: ExportedProgram, *, max_length: int = 2, dtypes: Optional[Sequence[torch.dtype]] = FLOATS
) -> list[TransformRecord]:
    """``cumsum(x, d)`` over a dim of length 1 or 2 -> ``x0 + 0`` and ``(x0 + 0) + x1`` (see module doc)."""
    if not 1 <= max_length <= 2:
        raise ValueError(f"short_cumsum_as_adds: max_length must be 1 or 2 (a longer scan is not exact as adds), got {max_length}")
    build = NodeBuilder(ep)
    zeros: dict[torch.dtype, torch.fx.Node] = {}
    records = []
    for node in calls_to(ep, ["aten.cumsum.default"]):
        x_node = node.args[0]
        x, out = tensor_of(x_node), tensor_of(node)
        if not is_plain(x, dtypes) or not is_static(out) or out.dtype != x.dtype or x.dim() == 0:
            continue
        if node.kwargs.get("dtype") not in (None, x.dtype) or (len(node.args) > 2 and node.args[2] not in (None, x.dtype)):
            continue
        dim = node.args[1] % x.dim()
        length = x.shape[dim]
        if not 1 <= length <= max_length:
            continue
        fresh = x.dtype not in zeros
        if fresh:
            zeros[x.dtype] = lift_constant(ep, torch.zeros((), dtype=x.dtype), "cumsum_zero", like=x_node)
        zero = zeros[x.dtype]
        first = build.call(node, "add", (slice_of(build, node, x_node, dim, 0, 1), zero), "Tensor")
        if length == 1:
            result = first
        else:
            second = build.call(node, "add", (first, slice_of(build, node, x_node, dim, 1, 2)), "Tensor")
            result = build.call(node, "cat", ([first, second], dim))
        build.replace(node, result)
        records.append(note_rewrite(
            "short_cumsum_as_adds", node, (1 if length == 1 else 5) + fresh,
            f"cumsum of {length} along dim {dim} of {list(x.shape)} as adds from +0" + ("" if fresh else " (shared zero)"),
            x.element_size() if fresh else 0,
        ))
    return records


__all__ = ["short_cumsum_as_adds"]
