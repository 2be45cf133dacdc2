"""Canonicalizing rewrites of attention's small ops at symbolic sizes: rotary embeddings and the safe softmax.

A decoder exported with a dynamic sequence length (the program a KV-cache
runtime loads) keeps a symbolic size in every activation. A partitioner that
refuses ops on tensors with a symbolic size (XNNPACK's slices) or ops on bool
tensors (its comparisons, ``any``, ``where``) leaves these on the CPU, one
graph break each, in every layer. Both rewrites act along the last dim, whose
size is static, so they hold at any value the symbolic sizes take.

- ``rotate_half_as_matmul(symbolic_only=True, dtypes=FLOATS)``: rotary
  embedding's ``rotate_half``, ``cat([neg(x[..., h:]), x[..., :h]], -1)``,
  becomes ``x @ R`` (a ``view_copy`` to 2-d, an ``mm`` with a constant
  ``2h x 2h`` matrix, a ``view_copy`` back). Each column of ``R`` holds one
  ``+1`` or ``-1`` and zeros, so each output is one product that is exact
  (``x * 1``, ``x * -1``) plus exact zeros: the same value for every finite
  input (a ``+0`` where the original had ``-0``; an ``inf`` or ``NaN`` in a
  row makes that row's other outputs ``NaN``, since ``0 * inf`` is ``NaN``).
  ``symbolic_only``: only where ``x`` has a symbolic size (a static slice a
  backend already takes is left alone).
- ``safe_softmax_as_floats(dtypes=FLOATS)``: ``_safe_softmax`` as export
  decomposes it, ``where(not any(x != -inf, d), 0, softmax(x, d))`` over the
  last dim, becomes float ops: ``softmax(clamp(x, min=lo), d) * keep``, with
  ``lo`` the dtype's lowest finite value, ``keep = clamp(count, 0, 1)`` and
  ``count`` the number of elements of the row above ``-inf``, summed as
  ``clamp(x + hi, 0, 1) @ ones`` (``hi`` the largest finite value: a finite
  element gives ``1``, ``-inf`` gives ``0``). A row of ``-inf`` gives ``0``
  as before (a uniform softmax times ``0``). Any other row gives the same
  value as before when its largest element is above ``lo / 2``: a ``-inf``
  clamped to ``lo`` still has ``exp(lo - max) == 0``. Scores that reach
  ``-1.7e38`` (float32) are outside that bound; masks that write ``lo``
  instead of ``-inf`` are too, and export's own mask writes ``-inf``. A row
  holding a ``NaN`` is ``NaN`` before and after in eager; a backend whose
  clamp turns ``NaN`` into a bound may give ``0`` for a row of only ``NaN``
  and ``-inf``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch.export import ExportedProgram

from edgeplug._graph.canonical.base import FLOATS
from edgeplug._graph.constants import lift_constant
from edgeplug._graph.ops import op_name
from edgeplug._graph.rewrite import NodeBuilder, calls_to, is_dense, is_static, note_rewrite, tensor_of
from edgeplug._records import TransformRecord

_BIG = 2**62  # what export writes for an open end of a slice is sys.maxsize; anything at or above the size is "to the end"


def _slice_range(node: torch.fx.Node) -> Optional[tuple[torch.fx.Node, int, int, int]]:
    """(input, dim, start, end) of a unit-step ``slice_copy`` with int bounds, dim and bounds normalized."""
    if op_name(node) != "aten.slice_copy.Tensor" or node.kwargs:
        return None
    given: list[Any] = [*node.args, *(0, None, None, 1)[len(node.args) - 1:]]
    x, dim, start, end, step = given
    xv = tensor_of(x)
    if xv is None or step != 1 or xv.dim() == 0 or not isinstance(dim, int):
        return None
    dim %= xv.dim()
    size = xv.shape[dim]
    start = 0 if start is None else start
    end = size if end is None or (type(end) is int and end >= _BIG) else end
    if type(size) is not int or type(start) is not int or type(end) is not int:
        return None
    start, end = (max(min(s + size if s < 0 else s, size), 0) for s in (start, end))
    return x, dim, start, end


def _rotate_half_source(cat: torch.fx.Node) -> Optional[tuple[torch.fx.Node, list[torch.fx.Node]]]:
    """``x`` and the neg and slices feeding ``cat`` when ``cat`` is ``cat([neg(x[..., h:2h]), x[..., :h]], -1)``."""
    parts = cat.args[0]
    out = tensor_of(cat)
    if not isinstance(parts, (list, tuple)) or len(parts) != 2 or out is None:
        return None
    dim = (cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)) % out.dim()
    neg, first = parts
    if not isinstance(neg, torch.fx.Node) or op_name(neg) != "aten.neg.default" or not isinstance(first, torch.fx.Node):
        return None
    hi, lo = _slice_range(neg.args[0]) if isinstance(neg.args[0], torch.fx.Node) else None, _slice_range(first)
    if hi is None or lo is None or hi[0] is not lo[0] or hi[1] != dim or lo[1] != dim or dim != out.dim() - 1:
        return None
    x = hi[0]
    size = tensor_of(x).shape[dim]
    if type(size) is not int or size % 2 or lo[2:] != (0, size // 2) or hi[2:] != (size // 2, size):
        return None
    return x, [neg, neg.args[0], first]  # each erased once nothing reads it


def rotate_half_as_matmul(
    ep: ExportedProgram, *, symbolic_only: bool = True, dtypes: Optional[Sequence[torch.dtype]] = FLOATS
) -> list[TransformRecord]:
    """``cat([neg(x[..., h:]), x[..., :h]], -1)`` -> ``x @ R`` with a constant sign permutation (see module doc)."""
    build = NodeBuilder(ep)
    matrices: dict[tuple[int, torch.dtype], torch.fx.Node] = {}
    records = []
    for node in calls_to(ep, ["aten.cat.default"]):
        found = _rotate_half_source(node)
        if found is None:
            continue
        x, fed = found
        xv = tensor_of(x)
        if not is_dense(xv, dtypes) or (symbolic_only and is_static(xv)):
            continue
        width, half = xv.shape[-1], xv.shape[-1] // 2
        key = (width, xv.dtype)
        fresh = key not in matrices
        if fresh:
            r = torch.zeros(width, width, dtype=xv.dtype)
            cols = torch.arange(half)
            r[cols + half, cols] = -1  # out[j] = -x[j + h] for j < h
            r[cols, cols + half] = 1  # out[j + h] = x[j]
            matrices[key] = lift_constant(ep, r, f"rotate_half_{width}", like=x)
        flat = build.view(node, x, [-1, width])
        product = build.call(node, "mm", (flat, matrices[key]))
        result = build.view(node, product, list(xv.shape))
        build.replace(node, result)
        erased = 0
        for n in fed:
            if not n.users:  # a slice or neg something else reads stays
                build.graph.erase_node(n)
                erased += 1
        records.append(note_rewrite(
            "rotate_half_as_matmul", node, 3 + fresh,
            f"rotate_half of {x.name} (last dim {width}) as a matmul with a constant {width}x{width} sign permutation"
            + ("" if fresh else " (shared)"),
            bytes_added=width * width * xv.element_size() if fresh else 0, removed=1 + erased,
        ))
    return records


# -- the safe softmax --------------------------------------------------------------------------


def _bool_chain(where: torch.fx.Node) -> Optional[tuple[torch.fx.Node, torch.fx.Node, list[torch.fx.Node]]]:
    """(softmax node, its input, the guard nodes) when ``where`` is decomposed ``_safe_softmax`` over the last dim."""
    if len(where.args) != 3:
        return None
    cond, fill, soft = where.args
    names = [op_name(n) if isinstance(n, torch.fx.Node) else None for n in (cond, fill, soft)]
    if names != ["aten.logical_not.default", "aten.full_like.default", "aten._softmax.default"]:
        return None
    if fill.args[0] is not soft or fill.args[1] != 0 or soft.args[2] is not False:
        return None
    x, sdim = soft.args[0], soft.args[1]
    xv = tensor_of(x)
    if xv is None or sdim % xv.dim() != xv.dim() - 1:
        return None
    anyd = cond.args[0]
    if not isinstance(anyd, torch.fx.Node) or op_name(anyd) != "aten.any.dim" or len(anyd.args) < 3 or anyd.args[2] is not True:
        return None
    if anyd.args[1] % xv.dim() != xv.dim() - 1:
        return None
    notx = anyd.args[0]
    if not isinstance(notx, torch.fx.Node) or op_name(notx) != "aten.logical_not.default":
        return None
    eq = notx.args[0]
    if not isinstance(eq, torch.fx.Node) or op_name(eq) != "aten.eq.Scalar" or eq.args[0] is not x or eq.args[1] != float("-inf"):
        return None
    guards = [cond, anyd, notx, eq, fill]
    if any(len(n.users) != 1 for n in guards) or len(soft.users) != 2:
        return None
    return soft, x, guards


def safe_softmax_as_floats(ep: ExportedProgram, *, dtypes: Optional[Sequence[torch.dtype]] = FLOATS) -> list[TransformRecord]:
    """Decomposed ``_safe_softmax`` over the last dim -> ``softmax(clamp(x, lo)) * clamp(count, 0, 1)`` (see module doc)."""
    build = NodeBuilder(ep)
    ones: dict[tuple[int, torch.dtype], torch.fx.Node] = {}
    records = []
    for node in calls_to(ep, ["aten.where.self"]):
        found = _bool_chain(node)
        if found is None:
            continue
        soft, x, guards = found
        xv = tensor_of(x)
        if not is_dense(xv, dtypes) or tensor_of(node).dtype != xv.dtype or xv.dim() < 1:
            continue
        width = xv.shape[-1]
        if type(width) is not int or width == 0 or width > 2**24:  # counts up to 2**24 are exact in float32
            continue
        info = torch.finfo(xv.dtype)
        key = (width, xv.dtype)
        fresh = key not in ones
        if fresh:
            ones[key] = lift_constant(ep, torch.ones(width, 1, dtype=xv.dtype), f"row_ones_{width}", like=x)
        before = len(build.graph.nodes)
        clamped = build.call(soft, "clamp", (x, info.min, None))
        soft.args = (clamped, *soft.args[1:])
        shifted = build.call(node, "add", (x, info.max), "Scalar")
        finite = build.call(node, "clamp", (shifted, 0.0, 1.0))
        count = build.call(node, "mm", (build.view(node, finite, [-1, width]), ones[key]))
        keep = build.call(node, "clamp", (build.view(node, count, [*xv.shape[:-1], 1]), 0.0, 1.0))
        result = build.call(node, "mul", (soft, keep), "Tensor")
        added = len(build.graph.nodes) - before
        build.replace(node, result)
        for n in guards:
            build.graph.erase_node(n)
        records.append(note_rewrite(
            "safe_softmax_as_floats", node, added + fresh,
            f"_safe_softmax of {x.name} (last dim {width}): softmax of x clamped to {info.min:.4g}, times 0 where the row "
            "is all -inf (a count of its finite elements by a matmul with ones, clamped to 1); exact while each row's "
            f"max is -inf or above {info.min / 2:.4g}",
            bytes_added=width * xv.element_size() if fresh else 0, removed=1 + len(guards),
        ))
    return records


__all__ = ["rotate_half_as_matmul", "safe_softmax_as_floats"]
