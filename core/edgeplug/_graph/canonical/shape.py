"""Canonicalizing rewrites of shapes: views, copies, expands, splits and selects in the forms a backend takes.

- ``unsqueeze_as_view(except_trailing=False, dtypes=None)`` and
  ``squeeze_as_view(dtypes=None)``: a ``view_copy`` to the same shape; on a
  contiguous tensor adding or dropping a size-1 dim moves no element.
- ``symbolic_view_sizes(dtypes=None)``: a ``view_copy`` whose sizes name a
  symbolic size (``sym_size`` of an input) writes that size ``-1`` and the
  others as ints; it makes the same shape.
- ``collapse_view_chains(dtypes=None)``: ``view_copy(view_copy(x, a), b)`` (squeezes and unsqueezes count as views)
  reads ``x`` directly (a view keeps the elements in row-major order, so two
  do what the last does), and a view to ``x``'s own shape is ``x``. Run
  before a pass that adds same-shape views on purpose (``expand_as_cat``'s
  distinct inputs). A weight squeezed and unsqueezed back is the parameter
  again, which a partitioner that wants a static weight takes.
- ``cat_distinct_inputs(dtypes=FLOATS)``: a ``cat`` of one tensor repeated
  (``cat((freqs, freqs), -1)`` in rotary tables) reads a same-shape
  ``view_copy`` of it after the first, for a backend that counts distinct
  inputs; the same elements in the same order.
- ``drop_identity_copies(ops=None)``: copies that change nothing (``alias_copy``,
  an ``expand_copy`` or a dim-order-preserving clone to the same shape and
  dtype, a ``cat`` of one tensor and empty ones) are replaced by what they
  copy (``edgeplug._graph.copies``).
- ``cancel_inverse_permutes()``: ``permute_copy(permute_copy(x, p), q)`` whose
  two orders undo each other reads ``x`` (a cache returned transposed and
  transposed back before attention, as executorch's ``CustomKVCache`` and
  ``SDPACustom`` do); the first permute goes where nothing else reads it.
  The same elements: no copy is made.
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
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Optional, Sequence

import torch
from torch.export import ExportedProgram

from edgeplug._graph.canonical.base import FLOATS
from edgeplug._graph.copies import is_identity_copy
from edgeplug._graph.ops import is_written, op_name
from edgeplug._graph.rewrite import NodeBuilder, calls_to, is_dense, is_plain, is_static, note_rewrite, tensor_of, view_shape
from edgeplug._records import TransformRecord

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


# -- view chains -------------------------------------------------------------------------------


def _erase_dead(node: Any) -> int:
    """Erase ``node`` and the views it read while nothing reads them any more; how many were erased."""
    erased = 0
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and not node.users:
        source = node.args[0] if op_name(node) == "aten.view_copy.default" else None
        node.graph.erase_node(node)
        node, erased = source, erased + 1
    return erased


#: ops that only reshape contiguous data (squeeze and unsqueeze are views of a given shape too)
_RESHAPES = ("aten.view_copy.default", "aten.squeeze_copy.dim", "aten.squeeze_copy.dims", "aten.squeeze_copy.default",
             "aten.unsqueeze_copy.default")


def collapse_view_chains(ep: ExportedProgram, *, dtypes: Optional[Sequence[torch.dtype]] = None) -> list[TransformRecord]:
    """A ``view_copy`` of a chain of reshapes (views, squeezes, unsqueezes) reads the chain's input; a chain
    back to the input's own shape is dropped (transformers' Mamba convolves with ``weight.squeeze(1).unsqueeze(1)``:
    a delegate that prepacks the weight then reads the parameter itself)."""
    build = NodeBuilder(ep)
    records = []
    for node in calls_to(ep, list(_RESHAPES)):
        if node.graph is not ep.graph_module.graph or node not in node.graph.nodes:
            continue  # erased as a dead link of a chain handled before
        inner, out = node.args[0], tensor_of(node)
        if not is_static(out) or (dtypes is not None and out.dtype not in dtypes):
            continue
        source = inner
        while isinstance(source, torch.fx.Node) and op_name(source) in _RESHAPES:
            source = source.args[0]
        src = tensor_of(source)
        if not is_static(src) or src.dtype != out.dtype or not src.is_contiguous() or is_written(source):
            continue
        if tuple(src.shape) == tuple(out.shape) and not any(u.op == "output" for u in node.users):
            build.replace(node, source)
            removed, detail = 1, f"views {source.name} at its own shape {list(out.shape)}: dropped"
        elif source is not inner and op_name(node) == "aten.view_copy.default":  # its target shape is explicit
            node.args = (source, *node.args[1:])
            removed, detail = 0, f"views {source.name} directly, not through {inner.name}"
        else:
            continue
        removed += _erase_dead(inner) if inner is not source else 0
        records.append(note_rewrite("collapse_view_chains", node, 0, detail, removed=removed))
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


# -- inverse permutes -------------------------------------------------------------------


_PERMUTES = ("aten.permute_copy.default", "aten.permute.default")


def _dims(node: torch.fx.Node) -> Optional[list[int]]:
    """A permute node's order, each dim non-negative; None when it is not a permute of a known rank."""
    if node.op != "call_function" or op_name(node) not in _PERMUTES or len(node.args) < 2:
        return None
    t = tensor_of(node)
    if t is None:
        return None
    rank = t.dim()
    dims = [int(d) % rank if rank else int(d) for d in node.args[1]]
    return dims if sorted(dims) == list(range(rank)) else None


def cancel_inverse_permutes(ep: ExportedProgram) -> list[TransformRecord]:
    """A permute of a permute whose orders compose to the identity replaced by the first one's input.

    ``permute(permute(x, p), q)[i]`` takes ``x``'s dim ``p[q[i]]``: the identity when that is ``i``
    for every dim. Neither value may be a program output or written in place.
    """
    build = NodeBuilder(ep)
    records = []
    for node in list(ep.graph_module.graph.nodes):
        outer = _dims(node)
        inner_node = node.args[0] if outer is not None and isinstance(node.args[0], torch.fx.Node) else None
        inner = _dims(inner_node) if inner_node is not None else None
        if inner is None or len(inner) != len(outer) or any(inner[outer[i]] != i for i in range(len(outer))):
            continue
        source = inner_node.args[0]
        if not isinstance(source, torch.fx.Node) or any(u.op == "output" for u in node.users):
            continue
        if is_written(node) or is_written(inner_node) or is_written(source):
            continue
        build.replace(node, source)
        removed = 1
        if not inner_node.users and not any(u.op == "output" for u in inner_node.users):
            build.graph.erase_node(inner_node)
            removed = 2
        records.append(note_rewrite(
            "cancel_inverse_permutes", node, 0,
            f"permute {outer} of permute {inner} of {source.name} is {source.name}", removed=removed,
        ))
    return records


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


__all__ = [
    "cat_distinct_inputs",
    "collapse_view_chains",
    "drop_identity_copies",
    "cancel_inverse_permutes",
    "expand_as_cat",
    "select_as_slice",
    "split_as_slices",
    "squeeze_as_view",
    "symbolic_view_sizes",
    "unsqueeze_as_view",
]
