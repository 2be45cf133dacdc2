"""Canonicalizing rewrites of constant masks and fills, as slices and pads.

They rest on what export fixes: a mask that is a constant of the program, a
fill of one value. (A state-space layer, Mamba-2's chunked scan, masks its
segment sums with constant triangles and starts its chunk states from
``full_like(x, 0)``.)

- ``cat_fill_as_pad(dtypes=FLOATS)``: ``cat([full_like(x, v), y], d)`` (or
  the fill second, or ``full``) -> ``constant_pad_nd(y, ..., v)`` along
  ``d``: both hold ``v`` converted to the dtype once, and ``y``'s elements.
- ``where_static_mask(max_pieces=4, dtypes=FLOATS)``: ``where(c, v, x)`` or
  ``where(c, x, v)`` with ``c`` a constant mask, ``v`` a constant of one
  value and ``x`` of the output's shape and dtype -> slices of ``x`` padded
  with ``v`` and joined by ``cat``. The mask must be the same for every
  index of the leading dims and take from each row (dim -2) one run of
  columns (dim -1), the empty rows at the top and bottom only: constant
  triangles and boxes. Rows with the same run form one piece; at most
  ``max_pieces`` pieces. A copy of elements and a fill: exact for every bit
  pattern.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch.export import ExportedProgram

from edgeplug._graph.canonical.base import FLOATS, slice_of
from edgeplug._graph.constants import constant_value
from edgeplug._graph.ops import op_name
from edgeplug._graph.rewrite import NodeBuilder, calls_to, is_plain, is_static, note_rewrite, tensor_of
from edgeplug._records import TransformRecord

# -- a fill next to a tensor in a cat, as a pad ------------------------------------------------

_FILLS = ("aten.full_like.default", "aten.full.default")


def _fill_value(node: Any) -> Optional[float]:
    """The value a ``full_like`` / ``full`` node fills with (default layout and format), else None."""
    if not isinstance(node, torch.fx.Node) or op_name(node) not in _FILLS or len(node.args) < 2:
        return None
    if node.kwargs.get("memory_format") not in (None, torch.contiguous_format, torch.preserve_format):
        return None
    value = node.args[1]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, int) and abs(value) > 2**53):
        return None  # an int beyond 2**53 would be rounded twice on its way through a float
    return float(value)


def cat_fill_as_pad(ep: ExportedProgram, *, dtypes: Optional[Sequence[torch.dtype]] = FLOATS) -> list[TransformRecord]:
    """``cat([fill(v), y], d)`` or ``cat([y, fill(v)], d)`` -> ``constant_pad_nd(y, ..., v)`` along ``d``."""
    build = NodeBuilder(ep)
    records = []
    for node in calls_to(ep, ["aten.cat.default"]):
        parts = node.args[0]
        out = tensor_of(node)
        if not isinstance(parts, (list, tuple)) or len(parts) != 2 or not is_plain(out, dtypes):
            continue
        fills = [_fill_value(p) for p in parts]
        if (fills[0] is None) == (fills[1] is None):
            continue  # no fill, or two
        i = 0 if fills[0] is not None else 1
        fill, y = parts[i], parts[1 - i]
        f, yv = tensor_of(fill), tensor_of(y)
        if not is_static(f, yv) or f.dtype != out.dtype or yv.dtype != out.dtype or not yv.is_contiguous():
            continue
        dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % out.dim()
        if f.dim() != out.dim() or any(a != b for k, (a, b) in enumerate(zip(f.shape, yv.shape)) if k != dim):
            continue
        pad = [0] * (2 * out.dim())
        pad[2 * (out.dim() - 1 - dim) + i] = int(f.shape[dim])  # [last lo, last hi, ..., dim lo, dim hi]: lo when the fill is first
        padded = build.call(node, "constant_pad_nd", (y, pad, fills[i]))
        build.replace(node, padded)
        dropped = not fill.users
        if dropped:
            build.graph.erase_node(fill)
        side = "before" if i == 0 else "after"
        records.append(note_rewrite(
            "cat_fill_as_pad", node, 1,
            f"{y.name} padded {side} along dim {dim} by {int(f.shape[dim])} with {fills[i]!r} (was a cat with {fill.name})",
            removed=2 if dropped else 1,
        ))
    return records


# -- where with a constant mask, as slices and pads ----------------------------------------------


_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _uniform(value: Optional[torch.Tensor]) -> Optional[float]:
    """The one value every element of ``value`` holds, bit for bit, else None (NaN too: a pad
    value is a Python float, which need not keep a NaN's payload)."""
    if value is None or value.numel() == 0 or not value.dtype.is_floating_point:
        return None
    flat = value.reshape(-1).contiguous()
    bits = flat.view(_BITS[flat.element_size()])
    if not bool((bits == bits[0]).all()) or bool(flat[0].isnan()):
        return None
    return float(flat[0].item())


def _row_runs(take: torch.Tensor) -> Optional[list[tuple[int, int, int, int]]]:
    """Pieces ``(row_start, row_end, col_start, col_end)`` of a 2-d mask: consecutive rows taking the same
    run of columns, the empty rows at the top and bottom left out. None when a row takes two runs
    or an empty row lies between rows that take some."""
    runs = []
    for row in take.tolist():
        cols = [j for j, t in enumerate(row) if t]
        if cols and cols != list(range(cols[0], cols[-1] + 1)):
            return None
        runs.append((cols[0], cols[-1] + 1) if cols else None)
    taken = [i for i, r in enumerate(runs) if r is not None]
    if not taken or any(runs[i] is None for i in range(taken[0], taken[-1] + 1)):
        return None
    pieces: list[tuple[int, int, int, int]] = []
    for i in range(taken[0], taken[-1] + 1):
        if pieces and pieces[-1][2:] == runs[i] and pieces[-1][1] == i:
            pieces[-1] = (pieces[-1][0], i + 1, *runs[i])
        else:
            pieces.append((i, i + 1, *runs[i]))
    return pieces


def _pad(build: NodeBuilder, origin: torch.fx.Node, x: torch.fx.Node, rows: tuple[int, int], cols: tuple[int, int], value: float) -> torch.fx.Node:
    """``x`` padded with ``value`` before/after along its last two dims (nothing made when no pad)."""
    if rows == (0, 0) and cols == (0, 0):
        return x
    return build.call(origin, "constant_pad_nd", (x, [*cols, *rows], value))


def _fill_and_source(
    ep: ExportedProgram, a: Any, b: Any, out: torch.Tensor, dtypes: Optional[Sequence[torch.dtype]]
) -> Optional[tuple[float, torch.fx.Node, bool]]:
    """(fill value, the operand read, whether it is ``where``'s other) of ``where(c, a, b)``: one operand
    a constant of one value in the output's dtype, the other of the output's shape and dtype."""
    for fill, x, x_is_other in ((a, b, True), (b, a, False)):
        if not isinstance(fill, torch.fx.Node) or not isinstance(x, torch.fx.Node):
            continue
        value, xv = constant_value(ep, fill), tensor_of(x)
        if value is None or value.dtype != out.dtype or not is_plain(xv, dtypes):
            continue
        v = _uniform(value)
        if v is not None and tuple(xv.shape) == tuple(out.shape) and xv.dtype == out.dtype:
            return v, x, x_is_other
    return None


def where_static_mask(
    ep: ExportedProgram, *, max_pieces: int = 4, dtypes: Optional[Sequence[torch.dtype]] = FLOATS
) -> list[TransformRecord]:
    """``where(c, v, x)`` / ``where(c, x, v)``, ``c`` a constant mask, ``v`` a one-value constant ->
    slices of ``x`` padded with ``v``, joined along dim -2 (see module doc)."""
    if max_pieces < 1:
        raise ValueError(f"where_static_mask: max_pieces must be at least 1, got {max_pieces}")
    build = NodeBuilder(ep)
    records = []
    for node in calls_to(ep, ["aten.where.self"]):
        out = tensor_of(node)
        if len(node.args) != 3 or not is_plain(out, dtypes) or out.dim() < 2 or out.numel() == 0:
            continue
        cond, a, b = node.args
        mask = constant_value(ep, cond) if isinstance(cond, torch.fx.Node) else None
        if mask is None or mask.dtype != torch.bool:
            continue
        found = _fill_and_source(ep, a, b, out, dtypes)
        if found is None:
            continue
        v, x, x_is_other = found
        try:
            take = mask.broadcast_to(out.shape)
        except RuntimeError:
            continue
        take = ~take if x_is_other else take  # where x is read
        grid = take.reshape(-1, *take.shape[-2:])
        if not bool((grid == grid[:1]).all()):
            continue  # the mask differs along the leading dims
        pieces = _row_runs(grid[0])
        if pieces is None or len(pieces) > max_pieces:
            continue
        rank, rows_total, cols_total = out.dim(), grid.shape[1], grid.shape[2]
        if len(pieces) == 1 and pieces[0] == (0, rows_total, 0, cols_total):
            if any(u.op == "output" for u in node.users):
                continue
            build.replace(node, x)  # the mask takes every element of x
            records.append(note_rewrite("where_static_mask", node, 0, f"the constant mask takes all of {x.name}: dropped"))
            continue
        row_dim, col_dim = rank - 2, rank - 1
        before = len(build.graph.nodes)
        made = []
        for r0, r1, c0, c1 in pieces:
            piece = slice_of(build, node, slice_of(build, node, x, row_dim, r0, r1), col_dim, c0, c1)
            made.append(_pad(build, node, piece, (0, 0), (c0, cols_total - c1), v))
        joined = made[0] if len(made) == 1 else build.call(node, "cat", (made, row_dim))
        result = _pad(build, node, joined, (pieces[0][0], rows_total - pieces[-1][1]), (0, 0), v)
        added = len(build.graph.nodes) - before
        build.replace(node, result)
        records.append(note_rewrite(
            "where_static_mask", node, added,
            f"{len(pieces)} piece(s) of {x.name} (rows:cols {', '.join(f'{r0}:{r1},{c0}:{c1}' for r0, r1, c0, c1 in pieces)}) "
            f"padded with {v!r} to {list(out.shape)}",
        ))
    return records


__all__ = ["cat_fill_as_pad", "where_static_mask"]
