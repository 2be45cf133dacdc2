"""Canonicalizing rewrites of reductions: the rank, dims, keepdim and dtype a backend reduces in.

- ``mean_at_rank(rank=4, dims=(2, 3), dtypes=FLOATS)``: a ``mean.dim`` over
  the trailing dims of a contiguous tensor becomes view, a mean over the
  backend's ``dims`` of a ``rank``-d tensor (kept), view. The elements each
  mean reads, their order and their count are unchanged. One symbolic size
  may stay among the kept dims (each view writes it ``-1``).
- ``reduce_with_keepdim(ops=(sum.dim_IntList, mean.dim, amax, amin))``: a
  reduction over some dims without ``keepdim`` becomes the same reduction
  with it, viewed without the reduced dims; ``keepdim`` only shapes the
  result.
- ``any_as_amax(dtype=float32)``: ``any.dim(b, d)`` of a bool tensor
  becomes ``ne(amax(where(b, 1, 0), [d]), 0)`` for a backend with float
  reductions and no bool one: 1 and 0 are exact in every float dtype, and
  the largest of them is 1 exactly when one element is true.
- ``int_sum_in_float(dtype=float32)``: ``sum.dim_IntList`` of an integer
  or bool tensor becomes convert to ``dtype``, sum, convert back, where
  ``integer_range`` proves every element within ``[lo, hi]`` (bools;
  constants the program does not write; views, copies and integer casts
  of those; products of those) and ``count * max(|lo|, |hi|)`` is at most
  ``2 / eps(dtype)`` (2**24 for float32): every partial sum, in any order,
  is then an integer ``dtype`` holds exactly.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch
from torch.export import ExportedProgram

from edgeplug._graph.canonical.base import FLOATS
from edgeplug._graph.constants import constant_value, lift_constant, mutated_targets
from edgeplug._graph.ops import is_written, op_name
from edgeplug._graph.rewrite import NodeBuilder, calls_to, is_dense, is_static, note_rewrite, tensor_of, view_shape
from edgeplug._records import TransformRecord

# -- mean at the backend's rank --------------------------------------------------------


def _fold_dims(shape: Sequence[int], slots: int, pad_front: bool) -> Optional[list[int]]:
    """``shape`` as ``slots`` dims: merge the leading ones, or pad with 1s (front or back)."""
    shape = list(shape)
    if len(shape) > slots:
        if slots == 0:
            return None
        cut = len(shape) - slots + 1
        shape = [math.prod(shape[:cut]), *shape[cut:]]
    pad = [1] * (slots - len(shape))
    return pad + shape if pad_front else shape + pad


def _check_rank_dims(rank: int, dims: Sequence[int]) -> tuple[int, ...]:
    if rank < 1:
        raise ValueError(f"mean_at_rank: rank must be at least 1, got {rank}")
    norm = sorted(d % rank for d in dims) if dims else []
    if not norm or norm != list(range(rank - len(norm), rank)):
        raise ValueError(
            f"mean_at_rank: dims {tuple(dims)} must be the trailing dims of rank {rank} (e.g. (2, 3) for rank 4)"
        )
    return tuple(norm)


def mean_at_rank(
    ep: ExportedProgram, *, rank: int = 4, dims: Sequence[int] = (2, 3), dtypes: Optional[Sequence[torch.dtype]] = FLOATS
) -> list[TransformRecord]:
    """A trailing-dims ``mean.dim`` as view -> ``mean(dims, keepdim)`` at ``rank`` -> view (see module doc)."""
    target = _check_rank_dims(rank, dims)
    build = NodeBuilder(ep)
    records = []
    for node in calls_to(ep, ["aten.mean.dim"]):
        x_node = node.args[0]
        x, out = tensor_of(x_node), tensor_of(node)
        # one symbolic size may stay, among the kept dims: each view then writes it -1
        if not is_dense(x, dtypes) or view_shape(out) is None or node.kwargs.get("dtype") is not None:
            continue
        reduced = sorted({d % x.dim() for d in node.args[1]}) if x.dim() and node.args[1] else None
        if not reduced or reduced != list(range(x.dim() - len(reduced), x.dim())):
            continue  # not the trailing dims (or every dim, written [] or None)
        if not all(type(d) is int for d in x.shape[x.dim() - len(reduced):]):
            continue  # a symbolic size among the reduced dims: the count of what each mean reads is not fixed
        keepdim = bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("keepdim", False))
        if x.dim() == rank and tuple(reduced) == target and keepdim:
            continue  # already what the backend takes
        cut = x.dim() - len(reduced)
        kept = _fold_dims(x.shape[:cut], rank - len(target), pad_front=True)
        red = _fold_dims(x.shape[cut:], len(target), pad_front=False)
        if kept is None or red is None:
            continue
        wide = build.view(node, x_node, kept + red)
        mean = build.call(node, "mean", (wide, list(target), True), "dim")
        back = build.view(node, mean, out.shape)
        build.replace(node, back)
        records.append(note_rewrite(
            "mean_at_rank", node, 3,
            f"mean over {list(target)} of a {rank}-d view {kept + red} of {list(x.shape)}, viewed back to {list(out.shape)}",
        ))
    return records


# -- any as a float max -----------------------------------------------------------------


def any_as_amax(ep: ExportedProgram, *, dtype: torch.dtype = torch.float32) -> list[TransformRecord]:
    """``any.dim(b, d, keepdim)`` -> ``ne.Scalar(amax(where(b, 1, 0), [d], keepdim), 0)`` (see module doc)."""
    if not dtype.is_floating_point:
        raise ValueError(f"any_as_amax: dtype must be a floating dtype, got {dtype}")
    build = NodeBuilder(ep)
    ones: list[torch.fx.Node] = []
    records = []
    for node in calls_to(ep, ["aten.any.dim"]):
        b_node = node.args[0]
        b, out = tensor_of(b_node), tensor_of(node)
        if not is_static(b, out) or b.dtype != torch.bool or out.dtype != torch.bool or b.dim() == 0:
            continue
        dim = node.args[1] % b.dim()
        if b.shape[dim] == 0:
            continue  # any over nothing is False; a max over nothing is an error
        keepdim = bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("keepdim", False))
        if not ones:
            ones += [lift_constant(ep, torch.tensor(v, dtype=dtype), f"any_{v:g}", like=b_node) for v in (1.0, 0.0)]
            added_constants = 2
        else:
            added_constants = 0
        as_float = build.call(node, "where", (b_node, *ones), "self")
        largest = build.call(node, "amax", (as_float, [dim], True))  # keepdim: what more backends reduce with
        if not keepdim:
            largest = build.view(node, largest, out.shape)
        build.replace(node, build.call(node, "ne", (largest, 0), "Scalar"))
        records.append(note_rewrite(
            "any_as_amax", node, (3 if keepdim else 4) + added_constants,
            f"ne(amax(where(b, 1, 0), [{dim}], keepdim){'' if keepdim else ' viewed as ' + str(list(out.shape))}, 0)"
            f" in {str(dtype).replace('torch.', '')}",
            2 * torch.tensor(0, dtype=dtype).element_size() if added_constants else 0,
        ))
    return records


# -- integer sums in float ---------------------------------------------------------------

#: ops that hand out some of their input's elements unchanged (or in another integer dtype)
_SAME_VALUES = frozenset({
    "aten.view_copy.default", "aten.unsqueeze_copy.default", "aten.squeeze_copy.default", "aten.squeeze_copy.dim",
    "aten.squeeze_copy.dims", "aten.expand_copy.default", "aten.permute_copy.default", "aten.clone.default",
    "aten.alias_copy.default", "aten.slice_copy.Tensor", "aten.select_copy.int", "aten._to_copy.default",
    "dim_order_ops._clone_dim_order.default", "dim_order_ops._to_dim_order_copy.default",
})
_INTEGERS = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _fits(lo: int, hi: int, dtype: torch.dtype) -> bool:
    if dtype == torch.bool:
        return 0 <= lo and hi <= 1
    info = torch.iinfo(dtype)
    return info.min <= lo and hi <= info.max


def integer_range(ep: ExportedProgram, node: Any, depth: int = 8) -> Optional[tuple[int, int]]:
    """Bounds ``(lo, hi)`` every element of an integer or bool node is proven to lie in, else None.

    Proven: a bool is 0 or 1; a constant (not written by the program) is within its
    own least and greatest element; a copy, view or integer conversion keeps its input's
    bounds (when the new dtype holds them); a product's bounds come from its factors'.
    """
    val = tensor_of(node)
    if val is None or val.dtype not in _INTEGERS or depth < 0:
        return None
    if val.dtype == torch.bool:
        return (0, 1)
    if node.op == "placeholder":
        value = constant_value(ep, node)
        spec = next((s for s in ep.graph_signature.input_specs if s.arg.name == node.name), None)
        written = is_written(node) or (spec is not None and spec.target in mutated_targets(ep))
        if value is None or value.numel() == 0 or written:
            return None
        return (int(value.min()), int(value.max()))
    if node.op != "call_function" or is_written(node):
        return None
    name = op_name(node)
    if name in _SAME_VALUES:
        bounds = integer_range(ep, node.args[0], depth - 1)
        return bounds if bounds is not None and _fits(*bounds, val.dtype) else None
    if name == "aten.mul.Tensor" and len(node.args) == 2 and not node.kwargs:
        a, b = (integer_range(ep, x, depth - 1) for x in node.args)
        if a is None or b is None:
            return None
        products = [x * y for x in a for y in b]
        bounds = (min(products), max(products))
        return bounds if _fits(*bounds, val.dtype) else None
    return None


def int_sum_in_float(ep: ExportedProgram, *, dtype: torch.dtype = torch.float32) -> list[TransformRecord]:
    """``sum.dim_IntList`` of an integer tensor -> convert to ``dtype``, sum, convert back (see module doc)."""
    if not dtype.is_floating_point:
        raise ValueError(f"int_sum_in_float: dtype must be a floating dtype, got {dtype}")
    exact_up_to = int(2 / torch.finfo(dtype).eps)  # every integer of at most this size is a float of dtype
    build = NodeBuilder(ep)
    records = []
    for node in calls_to(ep, ["aten.sum.dim_IntList"]):
        x_node = node.args[0]
        x, out = tensor_of(x_node), tensor_of(node)
        if not is_static(x, out) or x.dtype not in _INTEGERS or out.dtype not in _INTEGERS or node.kwargs.get("dtype") is not None:
            continue
        dims = node.args[1] if len(node.args) > 1 else None
        count = math.prod(x.shape[d % x.dim()] for d in dims) if dims and x.dim() else x.numel()
        bounds = integer_range(ep, x_node)
        if count == 0 or bounds is None:
            continue
        largest = count * max(abs(bounds[0]), abs(bounds[1]))
        if largest > exact_up_to:
            continue  # a partial sum could round
        wide = build.cast(node, x_node, dtype)
        total = build.call(node, "sum", (wide, *node.args[1:]), "dim_IntList", kwargs=dict(node.kwargs))
        build.replace(node, build.cast(node, total, out.dtype))
        records.append(note_rewrite(
            "int_sum_in_float", node, 3,
            f"{count} elements in [{bounds[0]}, {bounds[1]}]: every partial sum within ±{largest} "
            f"is exact in {str(dtype).replace('torch.', '')}",
        ))
    return records


# -- reductions that keep their dims -----------------------------------------------------

_REDUCTIONS = ("aten.sum.dim_IntList", "aten.mean.dim", "aten.amax.default", "aten.amin.default")


def reduce_with_keepdim(ep: ExportedProgram, *, ops: Sequence[str] = _REDUCTIONS) -> list[TransformRecord]:
    """A reduction without ``keepdim`` -> the same reduction with it, viewed without the reduced dims.

    ``keepdim`` only shapes the result: the same elements are reduced in the same order.
    """
    unknown = set(ops) - set(_REDUCTIONS)
    if unknown:
        raise ValueError(f"reduce_with_keepdim: unknown ops {sorted(unknown)}; it rewrites {list(_REDUCTIONS)}")
    build = NodeBuilder(ep)
    records = []
    for node in calls_to(ep, ops):
        x_node = node.args[0]
        x, out = tensor_of(x_node), tensor_of(node)
        if not is_static(x, out) or x.dim() == 0 or len(node.args) < 2 or not node.args[1]:
            continue  # every dim (written [] or None): the backend's full reductions are another matter
        keepdim = bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("keepdim", False))
        if keepdim:
            continue
        kwargs = {k: v for k, v in node.kwargs.items() if k != "keepdim"}
        kept = build.same_op(node, (x_node, node.args[1], True), kwargs)
        build.replace(node, build.view(node, kept, out.shape))
        records.append(note_rewrite(
            "reduce_with_keepdim", node, 2,
            f"{list(x.shape)} reduced over {list(node.args[1])} to {list(kept.meta['val'].shape)}, viewed as {list(out.shape)}",
        ))
    return records


__all__ = ["any_as_amax", "int_sum_in_float", "integer_range", "mean_at_rank", "reduce_with_keepdim"]
