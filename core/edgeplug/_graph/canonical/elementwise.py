"""Canonicalizing rewrites of elementwise ops: scalar operands as tensors, ranks a backend takes.

- ``scalar_to_tensor(ops=("mul", "add", "sub", "div"), dtypes=None)``:
  ``mul.Scalar(x, s)`` -> ``mul.Tensor(x, c)`` with ``c`` a 0-d constant of
  ``x``'s dtype. Only where ``s`` is exactly representable in that dtype:
  eager computes a scalar op in ``x``'s math type (float for half types),
  so the constant then holds the same number the scalar did.
- ``collapse_rank(max_rank=4, ops=None)``: an elementwise op (torch's
  ``pointwise`` tag, the ``*_like`` fills, hardswish) or ``cat`` on more
  than ``max_rank`` dims runs on views of at most ``max_rank`` dims and is
  viewed back. Only adjacent dims that every operand reads alike merge
  (each operand has the output's size on all of them, or is broadcast on
  all; size-1 dims join any run), size-1 dims first, then the leading ones;
  a cat's own dim is never merged with another of size > 1. The same
  elements meet in the same op; 0-d operands stay 0-d (they promote as
  scalars). ``ops``: op names (``"aten.exp.default"``), all such when None.
"""

from __future__ import annotations

import functools
import math
from typing import Optional, Sequence

import torch
from torch.export import ExportedProgram

from edgeplug._graph.constants import lift_constant
from edgeplug._graph.ops import op_name
from edgeplug._graph.rewrite import NodeBuilder, calls_to, is_plain, note_rewrite, tensor_of
from edgeplug._records import TransformRecord

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


__all__ = ["collapse_rank", "representable", "scalar_to_tensor"]
