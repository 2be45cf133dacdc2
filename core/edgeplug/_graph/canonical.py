"""Canonicalizing rewrites a backend chooses from.

Each rewrite replaces an op a backend refuses by ops that compute the same
values bit for bit and that the backend does take. A backend asks for the
ones it wants through its ``edgeplug_passes`` hook::

    from edgeplug._graph.canonical import rewrite_pass

    @edgeplug.hookimpl
    def edgeplug_passes():
        yield rewrite_pass("mean_at_rank", backend="mybackend", rank=4, dims=(2, 3))
        yield rewrite_pass("scalar_to_tensor", backend="mybackend")

Every rewrite runs on an edge-dialect program (aten programs work too),
changes it in place, leaves alone what it cannot prove equal (symbolic
sizes wherever the result depends on a size, tensors that are not
contiguous, dtypes outside ``dtypes``) and
records each change with ``edgeplug._graph.note`` (the report's
``transforms``). ``apply(ep, name, **params)`` runs one directly and
returns its records.

The rewrites (``REWRITES``; parameters with their defaults):

- ``scalar_to_tensor(ops=("mul", "add", "sub", "div"), dtypes=None)``:
  ``mul.Scalar(x, s)`` -> ``mul.Tensor(x, c)`` with ``c`` a 0-d constant of
  ``x``'s dtype. Only where ``s`` is exactly representable in that dtype:
  eager computes a scalar op in ``x``'s math type (float for half types),
  so the constant then holds the same number the scalar did.
- ``mean_at_rank(rank=4, dims=(2, 3), dtypes=FLOATS)``: a ``mean.dim`` over
  the trailing dims of a contiguous tensor becomes view, a mean over the
  backend's ``dims`` of a ``rank``-d tensor (kept), view. The elements each
  mean reads, their order and their count are unchanged.
- ``unsqueeze_as_view(except_trailing=False, dtypes=None)`` and
  ``squeeze_as_view(dtypes=None)``: a ``view_copy`` to the same shape; on a
  contiguous tensor adding or dropping a size-1 dim moves no element.
- ``expand_as_cat(max_inputs=None, distinct_inputs=False, max_copies=64,
  dtypes=FLOATS)``: an ``expand_copy`` that broadcasts size-1 dims becomes a
  ``cat`` of copies along each (cats of at most ``max_inputs`` inputs;
  ``distinct_inputs``: every cat reads two different nodes, the second a
  same-shape ``view_copy``), after a view adding the leading dims it adds;
  an expand to the shape it has is dropped. Copies are exact for every bit
  pattern.
- ``split_as_slices(dtypes=FLOATS)`` and ``select_as_slice(dtypes=FLOATS)``:
  each piece a ``split_with_sizes_copy`` / ``split_copy`` hands out becomes a
  ``slice_copy`` of its range; ``select_copy(x, d, i)`` a ``slice_copy`` of
  ``i:i+1`` viewed without ``d``. Both copy the same elements.
- ``any_as_amax(dtype=float32)``: ``any.dim(b, d)`` of a bool tensor
  becomes ``ne(amax(where(b, 1, 0), [d]), 0)`` for a backend with float
  reductions and no bool one: 1 and 0 are exact in every float dtype, and
  the largest of them is 1 exactly when one element is true.
- ``drop_identity_copies(ops=None)``: copies that change nothing (``alias_copy``,
  an ``expand_copy`` or a dim-order-preserving clone to the same shape and
  dtype, a ``cat`` of one tensor and empty ones) are replaced by what they
  copy (``edgeplug._graph.copies``).

- ``collapse_rank(max_rank=4, ops=None)``: an elementwise op (torch's
  ``pointwise`` tag, the ``*_like`` fills, hardswish) or ``cat`` on more
  than ``max_rank`` dims runs on views of at most ``max_rank`` dims and is
  viewed back. Only adjacent dims that every operand reads alike merge
  (each operand has the output's size on all of them, or is broadcast on
  all; size-1 dims join any run), size-1 dims first, then the leading ones;
  a cat's own dim is never merged with another of size > 1. The same
  elements meet in the same op; 0-d operands stay 0-d (they promote as
  scalars). ``ops``: op names (``"aten.exp.default"``), all such when None.
- ``int_sum_in_float(dtype=float32)``: ``sum.dim_IntList`` of an integer
  or bool tensor becomes convert to ``dtype``, sum, convert back, where
  ``integer_range`` proves every element within ``[lo, hi]`` (bools;
  constants the program does not write; views, copies and integer casts
  of those; products of those) and ``count * max(|lo|, |hi|)`` is at most
  ``2 / eps(dtype)`` (2**24 for float32): every partial sum, in any order,
  is then an integer ``dtype`` holds exactly.
- ``symbolic_view_sizes(dtypes=None)``: a ``view_copy`` whose sizes name a
  symbolic size (``sym_size`` of an input) writes that size ``-1`` and the
  others as ints; it makes the same shape. ``mean_at_rank``,
  ``unsqueeze_as_view`` and ``squeeze_as_view`` take a tensor with one
  symbolic size among the dims they keep, and write it ``-1`` too.
- ``cat_distinct_inputs(dtypes=FLOATS)``: a ``cat`` of one tensor repeated
  (``cat((freqs, freqs), -1)`` in rotary tables) reads a same-shape
  ``view_copy`` of it after the first, for a backend that counts distinct
  inputs; the same elements in the same order.
- ``reduce_with_keepdim(ops=(sum.dim_IntList, mean.dim, amax, amin))``: a
  reduction over some dims without ``keepdim`` becomes the same reduction
  with it, viewed without the reduced dims; ``keepdim`` only shapes the
  result.

``FLOATS`` is float32 and float16: the dtypes XNNPACK's ops take by default.
"""

from __future__ import annotations

import functools
import inspect
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import torch
from torch.export import ExportedProgram

from edgeplug._graph.constants import lift_constant
from edgeplug._graph.copies import is_identity_copy
from edgeplug._graph.names import reserve_node_names
from edgeplug._graph.ops import is_written, op_name
from edgeplug._graph.rewrite import NodeBuilder, calls_to, is_dense, is_plain, is_static, note_rewrite, tensor_of, view_shape
from edgeplug._records import PassSpec, TransformRecord

FLOATS: tuple[torch.dtype, ...] = (torch.float32, torch.float16)


# -- scalar ops to tensor ops ----------------------------------------------------------

_SCALAR_OPS = {"mul": "aten.mul.Scalar", "add": "aten.add.Scalar", "sub": "aten.sub.Scalar", "div": "aten.div.Scalar"}


def _math_type(dtype: torch.dtype) -> torch.dtype:
    """The type eager computes a float op of ``dtype`` in (``at::opmath_type``)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def representable(value: float, dtype: torch.dtype) -> bool:
    """``value`` held in ``dtype`` is the number eager computes with for a scalar operand."""
    math_type = _math_type(dtype)
    exact = torch.tensor(value, dtype=math_type)
    return bool(torch.equal(exact.to(dtype).to(math_type), exact)) or bool(math.isnan(value))


def _scalar_operand(node: torch.fx.Node) -> Optional[float]:
    """The scalar of ``op.Scalar(x, s)`` when ``alpha`` (add, sub) is 1, else None."""
    if len(node.args) < 2 or not isinstance(node.args[0], torch.fx.Node):
        return None
    s = node.args[1]
    if isinstance(s, bool) or not isinstance(s, (int, float)):
        return None
    alpha = node.args[2] if len(node.args) > 2 else node.kwargs.get("alpha", 1)
    if alpha != 1 or set(node.kwargs) - {"alpha"}:
        return None
    return s


def scalar_to_tensor(
    ep: ExportedProgram, *, ops: Sequence[str] = ("mul", "add", "sub", "div"), dtypes: Optional[Sequence[torch.dtype]] = None
) -> list[TransformRecord]:
    """``op.Scalar(x, s)`` -> ``op.Tensor(x, c)``, ``c`` a 0-d constant of ``x``'s dtype (see module doc)."""
    unknown = set(ops) - set(_SCALAR_OPS)
    if unknown:
        raise ValueError(f"scalar_to_tensor: unknown ops {sorted(unknown)}; it rewrites {sorted(_SCALAR_OPS)}")
    build = NodeBuilder(ep)
    constants: dict[tuple[torch.dtype, str], torch.fx.Node] = {}
    records = []
    for node in calls_to(ep, (_SCALAR_OPS[o] for o in ops)):
        x, out, s = tensor_of(node.args[0]), tensor_of(node), _scalar_operand(node)
        if s is None or x is None or out is None or not x.dtype.is_floating_point or out.dtype != x.dtype:
            continue
        if (dtypes is not None and x.dtype not in dtypes) or not representable(s, x.dtype):
            continue
        key = (x.dtype, repr(float(s)))
        fresh = key not in constants
        if fresh:
            value = torch.tensor(s, dtype=x.dtype)
            constants[key] = lift_constant(ep, value, f"scalar_{node.name}", like=node.args[0])
        base = op_name(node).split(".")[1]
        new = build.call(node, base, (node.args[0], constants[key]), "Tensor")
        build.replace(node, new)
        records.append(note_rewrite(
            "scalar_to_tensor", node, 2 if fresh else 1,
            f"{base}.Tensor with a 0-d {str(x.dtype).replace('torch.', '')} constant {s!r}"
            + ("" if fresh else " (shared)"),
            x.element_size() if fresh else 0,
        ))
    return records


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


# -- unsqueeze / squeeze as a view -----------------------------------------------------


def _as_view(
    ep: ExportedProgram, name: str, ops: Sequence[str], dtypes: Optional[Sequence[torch.dtype]],
    skip: Callable[[torch.fx.Node, torch.Tensor], bool] = lambda node, x: False,
) -> list[TransformRecord]:
    build = NodeBuilder(ep)
    records = []
    for node in calls_to(ep, ops):
        x_node = node.args[0]
        x, out = tensor_of(x_node), tensor_of(node)
        if not is_dense(x, dtypes) or view_shape(out) is None or out.dtype != x.dtype or skip(node, x):
            continue
        build.replace(node, build.view(node, x_node, out.shape))
        records.append(note_rewrite(name, node, 1, f"view_copy {list(x.shape)} -> {list(out.shape)}"))
    return records


def symbolic_view_sizes(ep: ExportedProgram, *, dtypes: Optional[Sequence[torch.dtype]] = None) -> list[TransformRecord]:
    """A ``view_copy`` whose shape names a symbolic size (a ``sym_size`` node) writes it ``-1``.

    The view makes the same shape (see ``view_shape``); only a view with one symbolic output size
    changes, its other sizes written as the ints they are (an inferred ``-1`` among them included).
    """
    records = []
    for node in calls_to(ep, ["aten.view_copy.default"]):
        x, out = tensor_of(node.args[0]), tensor_of(node)
        shape = view_shape(out)
        if shape is None or x is None or (dtypes is not None and out.dtype not in dtypes) or len(node.args) < 2:
            continue
        if all(type(d) is int for d in node.args[1]) and list(node.args[1]).count(-1) <= 1:
            continue  # already sizes a partitioner reads
        before = [getattr(d, "name", d) for d in node.args[1]]
        node.args = (node.args[0], shape, *node.args[2:])
        records.append(note_rewrite("symbolic_view_sizes", node, 1, f"view_copy sizes {before} -> {shape}"))
    return records


def cat_distinct_inputs(ep: ExportedProgram, *, dtypes: Optional[Sequence[torch.dtype]] = FLOATS) -> list[TransformRecord]:
    """A ``cat`` of one tensor repeated (rotary tables: ``cat((freqs, freqs), -1)``) reads a same-shape
    ``view_copy`` of it as its second input, for a backend that counts distinct inputs (XNNPACK needs two).

    The view copies the same elements in the same order; one symbolic size is written ``-1``.
    """
    build = NodeBuilder(ep)
    records = []
    for node in calls_to(ep, ["aten.cat.default"]):
        pieces = node.args[0]
        if not isinstance(pieces, (list, tuple)) or len(pieces) < 2 or len(set(pieces)) != 1:
            continue
        x = tensor_of(pieces[0])
        if not is_dense(x, dtypes):
            continue
        twin = build.view(node, pieces[0], x.shape)
        node.args = ([pieces[0]] + [twin] * (len(pieces) - 1), *node.args[1:])
        records.append(note_rewrite(
            "cat_distinct_inputs", node, 1, f"cat of {len(pieces)} copies of {pieces[0].name}: the others read a view of it",
            removed=0,
        ))
    return records


def unsqueeze_as_view(
    ep: ExportedProgram, *, except_trailing: bool = False, dtypes: Optional[Sequence[torch.dtype]] = None
) -> list[TransformRecord]:
    """``unsqueeze_copy`` -> ``view_copy``; ``except_trailing`` leaves an unsqueeze of the last dim alone."""

    def trailing(node: torch.fx.Node, x: torch.Tensor) -> bool:
        return except_trailing and node.args[1] in (-1, x.dim())

    return _as_view(ep, "unsqueeze_as_view", ["aten.unsqueeze_copy.default"], dtypes, trailing)


def squeeze_as_view(ep: ExportedProgram, *, dtypes: Optional[Sequence[torch.dtype]] = None) -> list[TransformRecord]:
    """``squeeze_copy`` (every overload) -> ``view_copy``."""
    ops = ["aten.squeeze_copy.default", "aten.squeeze_copy.dim", "aten.squeeze_copy.dims"]
    return _as_view(ep, "squeeze_as_view", ops, dtypes)


# -- expand as cat ---------------------------------------------------------------------


def _copies(
    build: NodeBuilder, origin: torch.fx.Node, src: torch.fx.Node, n: int, dim: int, max_inputs: Optional[int], distinct: bool
) -> tuple[torch.fx.Node, int]:
    """``n`` copies of ``src`` along ``dim`` as cats of at most ``max_inputs`` inputs; (result, nodes made).

    ``distinct``: each cat reads at least two different nodes (``src`` and a
    same-shape ``view_copy`` of it), for a backend that counts distinct inputs.
    """
    if n == 1:
        return src, 0
    twin, made = src, 0
    if distinct:
        twin, made = build.view(origin, src, tensor_of(src).shape), 1
    width = n if max_inputs is None else min(n, max_inputs)
    block = build.call(origin, "cat", ([src] + [twin] * (width - 1), dim))
    made += 1
    if width == n:
        return block, made
    q, r = divmod(n, width)
    blocks, more = _copies(build, origin, block, q, dim, max_inputs, distinct)
    made += more
    if r == 0:
        return blocks, made
    return build.call(origin, "cat", ([blocks] + [src] * r, dim)), made + 1


def expand_as_cat(
    ep: ExportedProgram,
    *,
    max_inputs: Optional[int] = None,
    distinct_inputs: bool = False,
    max_copies: int = 64,
    dtypes: Optional[Sequence[torch.dtype]] = FLOATS,
) -> list[TransformRecord]:
    """``expand_copy`` of size-1 dims -> view (new leading dims) and cats of copies (see module doc)."""
    if max_inputs is not None and max_inputs < 2:
        raise ValueError(f"expand_as_cat: max_inputs must be at least 2 (or None), got {max_inputs}")
    build = NodeBuilder(ep)
    records = []
    for node in calls_to(ep, ["aten.expand_copy.default"]):
        x_node = node.args[0]
        x, out = tensor_of(x_node), tensor_of(node)
        if not is_plain(x, dtypes) or not is_static(out) or out.dtype != x.dtype:
            continue
        lead = out.dim() - x.dim()
        shape = [1] * lead + list(x.shape)
        grow = [(i, k) for i, (s, k) in enumerate(zip(shape, out.shape)) if s != k]
        if any(shape[i] != 1 for i, _ in grow) or any(k > max_copies for _, k in grow):
            continue
        if not grow and not lead:
            if any(u.op == "output" for u in node.users):
                continue  # an output must not alias its input
            build.replace(node, x_node)
            records.append(note_rewrite("expand_as_cat", node, 0, f"expand to the shape it has {list(x.shape)}: dropped"))
            continue
        cur, added = x_node, 0
        if lead:
            cur, added = build.view(node, x_node, shape), 1
        for i, k in grow:
            cur, made = _copies(build, node, cur, k, i, max_inputs, distinct_inputs)
            added += made
        build.replace(node, cur)
        what = ", ".join(f"{k} copies along dim {i}" for i, k in grow)
        records.append(note_rewrite("expand_as_cat", node, added, f"{list(x.shape)} -> {list(out.shape)}: cat of {what}"))
    return records


# -- split and select as slices --------------------------------------------------------


def split_as_slices(ep: ExportedProgram, *, dtypes: Optional[Sequence[torch.dtype]] = FLOATS) -> list[TransformRecord]:
    """``split_with_sizes_copy`` / ``split_copy``: each piece taken becomes a ``slice_copy`` of its range."""
    build = NodeBuilder(ep)
    records = []
    for node in calls_to(ep, ["aten.split_with_sizes_copy.default", "aten.split_copy.Tensor"]):
        x_node = node.args[0]
        x = tensor_of(x_node)
        pieces = node.meta.get("val")
        if not is_static(x) or (dtypes is not None and x.dtype not in dtypes) or not isinstance(pieces, (list, tuple)):
            continue
        if not is_static(*pieces) or not all(u.op == "call_function" and u.target is operator.getitem for u in node.users):
            continue  # a user that takes the whole list, or symbolic sizes
        dim = (node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)) % x.dim()
        starts = [sum(p.shape[dim] for p in pieces[:i]) for i in range(len(pieces))]
        items = list(node.users)
        for item in items:
            i = item.args[1]
            piece = build.call(item, "slice_copy", (x_node, dim, starts[i], starts[i] + pieces[i].shape[dim]), "Tensor")
            build.replace(item, piece)
        build.graph.erase_node(node)
        records.append(note_rewrite(
            "split_as_slices", node, len(items),
            f"{len(items)} of {len(pieces)} pieces of {list(x.shape)} along dim {dim} as slices", removed=1 + len(items),
        ))
    return records


def select_as_slice(ep: ExportedProgram, *, dtypes: Optional[Sequence[torch.dtype]] = FLOATS) -> list[TransformRecord]:
    """``select_copy(x, d, i)`` -> ``slice_copy(x, d, i, i + 1)`` viewed without dim ``d``."""
    build = NodeBuilder(ep)
    records = []
    for node in calls_to(ep, ["aten.select_copy.int"]):
        x_node = node.args[0]
        x, out = tensor_of(x_node), tensor_of(node)
        if not is_static(x, out) or (dtypes is not None and x.dtype not in dtypes) or x.dim() == 0:
            continue
        dim = node.args[1] % x.dim()
        index = node.args[2] % x.shape[dim] if x.shape[dim] else None
        if index is None:
            continue
        piece = build.call(node, "slice_copy", (x_node, dim, index, index + 1), "Tensor")
        if not piece.meta["val"].is_contiguous():
            build.graph.erase_node(piece)
            continue
        build.replace(node, build.view(node, piece, out.shape))
        records.append(note_rewrite("select_as_slice", node, 2, f"slice {index}:{index + 1} of dim {dim} of {list(x.shape)}, viewed as {list(out.shape)}"))
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


# -- copies that change nothing --------------------------------------------------------


def _copied(node: torch.fx.Node) -> Optional[torch.fx.Node]:
    """What ``node`` copies unchanged: an identity copy's input, or a ``cat``'s one non-empty input
    when that has the cat's shape and dtype (the others hold no element). Else None."""
    if is_identity_copy(node):
        return node.args[0]
    if op_name(node) != "aten.cat.default" or not isinstance(node.args[0], (list, tuple)):
        return None
    out = tensor_of(node)
    full = [a for a in node.args[0] if tensor_of(a) is None or tensor_of(a).numel() != 0]
    if len(full) != 1 or not isinstance(full[0], torch.fx.Node) or not is_static(out, tensor_of(full[0])):
        return None
    kept = tensor_of(full[0])
    same = tuple(kept.shape) == tuple(out.shape) and kept.dtype == out.dtype and kept.is_contiguous()
    return full[0] if same else None


def drop_identity_copies(ep: ExportedProgram, *, ops: Optional[Sequence[str]] = None) -> list[TransformRecord]:
    """Copies that change nothing replaced by what they copy; ``ops``: op names to consider (all when None).

    An identity copy (``edgeplug._graph.copies``), or a ``cat`` of one tensor (and empty ones). A
    copy whose value is a program output stays (an output must not alias an input or another output).
    """
    build = NodeBuilder(ep)
    wanted = set(ops) if ops is not None else None
    records = []
    for node in list(ep.graph_module.graph.nodes):
        if node.op != "call_function" or (wanted is not None and op_name(node) not in wanted):
            continue
        source = _copied(node)
        if source is None or any(u.op == "output" for u in node.users):
            continue
        if is_written(node) or is_written(source):
            continue  # one of them is changed in place: the two values differ afterwards
        build.replace(node, source)
        records.append(note_rewrite("drop_identity_copies", node, 0, f"copies {source.name} unchanged"))
    return records


# -- elementwise ops and cat at a lower rank ---------------------------------------------

#: ops whose every output element depends on the operands' elements at its own (broadcast)
#: index only, beyond those torch tags ``pointwise``: fills shaped like their input, hardswish
_ELEMENTWISE_UNTAGGED = frozenset({
    "aten.full_like.default", "aten.zeros_like.default", "aten.ones_like.default", "aten.hardswish.default",
})
_CAT = "aten.cat.default"


@functools.lru_cache(maxsize=None)
def _collapsible(name: str) -> bool:
    """``name`` (``"aten.exp.default"``) is ``cat``, in ``_ELEMENTWISE_UNTAGGED`` or an op torch tags
    ``pointwise`` that writes no input and draws from no RNG."""
    if name == _CAT or name in _ELEMENTWISE_UNTAGGED:
        return True
    namespace, _, rest = name.partition(".")
    packet, _, overload = rest.rpartition(".")
    op = getattr(getattr(getattr(torch.ops, namespace, None), packet, None), overload, None)
    if not isinstance(op, torch._ops.OpOverload) or torch.Tag.nondeterministic_seeded in op.tags:
        return False  # (an RNG op: its draws are not the op's to rearrange)
    return torch.Tag.pointwise in op.tags and not op._schema.is_mutable


def _merge_dims(signatures: Sequence[Optional[tuple]], max_rank: int) -> Optional[list[list[int]]]:
    """The dims of a tensor as at most ``max_rank`` runs of adjacent dims, merging no more than needed.

    ``signatures[d]``: how the op reads dim ``d`` of its operands (None: size 1,
    which fits any run). Two runs merge when their signatures agree; runs of
    size-1 dims go first, then the leading dims, so the innermost dims stay as
    they were. None when no merging gets down to ``max_rank``.
    """
    runs = [[d] for d in range(len(signatures))]
    sigs = list(signatures)
    while len(runs) > max_rank:
        fits = [i for i in range(len(runs) - 1) if sigs[i] is None or sigs[i + 1] is None or sigs[i] == sigs[i + 1]]
        if not fits:
            return None
        i = next((i for i in fits if sigs[i] is None or sigs[i + 1] is None), fits[0])
        runs[i:i + 2] = [runs[i] + runs[i + 1]]
        sigs[i:i + 2] = [sigs[i] if sigs[i] is not None else sigs[i + 1]]
    return runs


def _merged(shape: Sequence[int], rank: int, runs: list[list[int]]) -> list[int]:
    """``shape`` (aligned to the right end of ``rank`` dims) with each run's dims merged into one."""
    aligned = [1] * (rank - len(shape)) + list(shape)
    return [math.prod(aligned[d] for d in run) for run in runs]


def _collapse_elementwise(build: NodeBuilder, node: torch.fx.Node, max_rank: int) -> Optional[TransformRecord]:
    out = tensor_of(node)
    operands = [a for a in node.args if isinstance(a, torch.fx.Node)]
    nested = [a for a in node.args if isinstance(a, (list, tuple)) and any(isinstance(x, torch.fx.Node) for x in a)]
    if nested or any(isinstance(v, torch.fx.Node) for v in node.kwargs.values()):
        return None
    vals = [tensor_of(a) for a in operands]
    if not is_plain(out, None) or not all(is_plain(v, None) for v in vals) or out.numel() == 0:
        return None
    if max(v.dim() for v in [out, *vals]) <= max_rank:
        return None
    # per dim, per operand: read whole (its size is the output's) or broadcast (size 1)
    aligned = [[1] * (out.dim() - v.dim()) + list(v.shape) for v in vals]
    signatures = [None if out.shape[d] == 1 else tuple(s[d] == out.shape[d] for s in aligned) for d in range(out.dim())]
    runs = _merge_dims(signatures, max_rank)
    if runs is None:
        return None  # broadcasting that cannot merge
    views: dict[torch.fx.Node, torch.fx.Node] = {}
    made: list[torch.fx.Node] = []
    for a, v in zip(operands, vals):
        shape = _merged(v.shape, out.dim(), runs)
        lead = len(shape) - v.dim()
        if lead >= 0 and all(d == 1 for d in shape[:lead]):
            shape = shape[lead:]  # broadcasting adds the leading 1s
        # a 0-d operand stays 0-d: it broadcasts and promotes as one
        if v.dim() and a not in views and list(v.shape) != shape:
            views[a] = build.view(node, a, shape)
            made.append(views[a])
    args = tuple(views.get(a, a) if isinstance(a, torch.fx.Node) else a for a in node.args)
    low = build.same_op(node, args, node.kwargs)
    made.append(low)
    if low.meta["val"].dtype != out.dtype or list(low.meta["val"].shape) != _merged(out.shape, out.dim(), runs):
        for n in reversed(made):  # not the op it claimed to be at this rank
            build.graph.erase_node(n)
        return None
    build.replace(node, build.view(node, low, out.shape))
    return note_rewrite(
        "collapse_rank", node, len(made) + 1,
        f"{list(out.shape)} at rank {len(runs)} as {list(low.meta['val'].shape)}"
        + "".join(f"; {a.name} {list(tensor_of(a).shape)} as {list(tensor_of(w).shape)}" for a, w in views.items()),
    )


def _collapse_cat(build: NodeBuilder, node: torch.fx.Node, max_rank: int) -> Optional[TransformRecord]:
    tensors = node.args[0]
    out = tensor_of(node)
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, torch.fx.Node) for t in tensors):
        return None
    vals = [tensor_of(t) for t in tensors]
    if not is_plain(out, None) or not all(is_plain(v, None) and v.dim() == out.dim() for v in vals):
        return None  # (a legacy empty 1-d input has another rank)
    if out.dim() <= max_rank:
        return None
    dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % out.dim()
    # the cat dim stays its own; the dims before it merge, and those after it
    signatures = [("cat",) if d == dim else None if out.shape[d] == 1 else (d > dim,) for d in range(out.dim())]
    runs = _merge_dims(signatures, max_rank)
    if runs is None:
        return None
    low_dim = next(i for i, run in enumerate(runs) if dim in run)
    views = [build.view(node, t, _merged(v.shape, out.dim(), runs)) for t, v in zip(tensors, vals)]
    low = build.call(node, "cat", (views, low_dim))
    build.replace(node, build.view(node, low, out.shape))
    return note_rewrite(
        "collapse_rank", node, len(views) + 2,
        f"cat along dim {dim} of {list(out.shape)} as a cat along dim {low_dim} of {list(low.meta['val'].shape)}",
    )


def collapse_rank(ep: ExportedProgram, *, max_rank: int = 4, ops: Optional[Sequence[str]] = None) -> list[TransformRecord]:
    """Elementwise ops and ``cat`` on tensors of rank > ``max_rank`` run on views of at most ``max_rank`` dims.

    ``ops``: op names (``"aten.exp.default"``) to rewrite; every elementwise op and ``cat`` when None.
    """
    if max_rank < 1:
        raise ValueError(f"collapse_rank: max_rank must be at least 1, got {max_rank}")
    for name in ops or ():
        if not _collapsible(name):
            raise ValueError(f"collapse_rank: {name} is neither elementwise nor cat; it cannot be collapsed")
    build = NodeBuilder(ep)
    records = []
    wanted = None if ops is None else set(ops)
    for node in [n for n in ep.graph_module.graph.nodes if n.op == "call_function"]:
        name = op_name(node)
        if wanted is not None and name not in wanted:
            continue
        if name == _CAT:
            record = _collapse_cat(build, node, max_rank)
        elif _collapsible(name):
            record = _collapse_elementwise(build, node, max_rank)
        else:
            continue
        if record is not None:
            records.append(record)
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
    from edgeplug._graph.constants import constant_value, mutated_targets

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


# -- the registry and the pass factory -------------------------------------------------


@dataclass(frozen=True)
class Rewrite:
    """A named rewrite: ``fn(ep, **params) -> list[TransformRecord]``, changing ``ep`` in place."""

    name: str
    fn: Callable[..., list[TransformRecord]]

    def check(self, params: dict[str, Any]) -> None:
        """Raise TypeError naming the rewrite when ``params`` are not its parameters."""
        try:
            inspect.signature(self.fn).bind(None, **params)
        except TypeError as exc:
            accepted = [p for p in inspect.signature(self.fn).parameters if p != "ep"]
            raise TypeError(f"rewrite {self.name!r} takes {accepted}, got {sorted(params)}: {exc}") from None


REWRITES: dict[str, Rewrite] = {
    r.name: r
    for r in (
        Rewrite("scalar_to_tensor", scalar_to_tensor),
        Rewrite("mean_at_rank", mean_at_rank),
        Rewrite("unsqueeze_as_view", unsqueeze_as_view),
        Rewrite("squeeze_as_view", squeeze_as_view),
        Rewrite("expand_as_cat", expand_as_cat),
        Rewrite("drop_identity_copies", drop_identity_copies),
        Rewrite("any_as_amax", any_as_amax),
        Rewrite("split_as_slices", split_as_slices),
        Rewrite("select_as_slice", select_as_slice),
        Rewrite("collapse_rank", collapse_rank),
        Rewrite("int_sum_in_float", int_sum_in_float),
        Rewrite("reduce_with_keepdim", reduce_with_keepdim),
        Rewrite("symbolic_view_sizes", symbolic_view_sizes),
        Rewrite("cat_distinct_inputs", cat_distinct_inputs),
    )
}


def _rewrite(name: str) -> Rewrite:
    try:
        return REWRITES[name]
    except KeyError:
        raise ValueError(f"no canonicalizing rewrite {name!r}; the core has {sorted(REWRITES)}") from None


def apply(ep: ExportedProgram, name: str, **params: Any) -> list[TransformRecord]:
    """Run the rewrite ``name`` on ``ep`` in place (names reserved, graph linted and recompiled); its records."""
    rewrite = _rewrite(name)
    rewrite.check(params)
    reserve_node_names(ep)
    records = rewrite.fn(ep, **params)
    if records:
        ep.graph_module.graph.lint()
        ep.graph_module.recompile()
    return records


def _run_in_pass(fn: Callable[..., Any], params: dict[str, Any], ep: ExportedProgram) -> None:
    fn(ep, **params)  # the pass runner reserves names, lints and recompiles
    return None


def rewrite_pass(
    name: str,
    *,
    backend: str,
    stage: str = "pre_partition",
    order: int = 0,
    before: Union[str, Sequence[str]] = (),
    after: Union[str, Sequence[str]] = (),
    **params: Any,
) -> PassSpec:
    """The ``PassSpec`` that runs the core's rewrite ``name`` for ``backend`` with ``params``.

    By default it runs in the ``"pre_partition"`` stage, after the core's
    fusion: the fusion matches the norms as exported, and the rewrites shape
    what is left for the partitioner. ``stage="edge"`` runs it before the
    fusion. The pass is named ``name``; ``order``, ``before`` and ``after``
    place it among the backend's other passes of that stage. Unknown names and
    parameters raise here, when the plugin declares the pass.
    """
    if stage not in ("edge", "pre_partition"):
        raise ValueError(f"rewrite {name!r}: stage must be 'edge' or 'pre_partition' (an edge-dialect stage), got {stage!r}")
    rewrite = _rewrite(name)
    rewrite.check(params)
    return PassSpec(
        backend=backend, stage=stage, name=name, fn=functools.partial(_run_in_pass, rewrite.fn, dict(params)),
        order=order, before=before, after=after,
    )


__all__ = [
    "FLOATS",
    "REWRITES",
    "Rewrite",
    "any_as_amax",
    "apply",
    "cat_distinct_inputs",
    "collapse_rank",
    "drop_identity_copies",
    "expand_as_cat",
    "int_sum_in_float",
    "integer_range",
    "mean_at_rank",
    "reduce_with_keepdim",
    "representable",
    "rewrite_pass",
    "scalar_to_tensor",
    "select_as_slice",
    "split_as_slices",
    "squeeze_as_view",
    "symbolic_view_sizes",
    "unsqueeze_as_view",
]

# the rewrites that rest on what export fixes (constant masks, fills, short scans, view chains)
# join REWRITES from their own module; importing it here keeps the registry whole
from edgeplug._graph import canonical_static as _static_rewrites  # noqa: E402,F401
