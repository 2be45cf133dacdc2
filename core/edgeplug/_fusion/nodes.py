"""What fusion reads of a node, in one place: the falsy rejection (``NoMatch``), op, cast and dtype
predicates, and the constant analysis (``edgeplug._graph``'s, re-exported so no other fusion
module reads the graph's predicates elsewhere)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

# the one place fusion takes what it reads of a graph from: op predicates and the constant analysis
# (re-exported: the matcher and its guards import them from here)
from edgeplug._graph import ConstantAnalysis, analyze_constants, resolve_scalar  # noqa: F401
from edgeplug._graph.ops import aten_overload, dtype_name, is_dequantize, is_qdq, op_name, qualified_name  # noqa: F401


@dataclass(frozen=True)
class NoMatch:
    """A node that is not (or not safely) an instance of a pattern.

    Falsy, so ``if not (m := match(node, ep)): print(m.reason)`` reads
    naturally. ``candidate`` is True when the node looked like the pattern
    and was refused by a guard: such rejections are worth reporting; the
    other nodes of a graph are simply not the pattern.
    """

    reason: str
    node: Optional[torch.fx.Node] = None
    candidate: bool = True

    def __bool__(self) -> bool:
        return False


def not_candidate(node: torch.fx.Node, what: str = "") -> NoMatch:
    return NoMatch(what or f"{describe(node)} is not the pattern", node, candidate=False)


def is_op(node: Any, *names: str) -> bool:
    """``node`` calls one of ``names`` ("aten::mul.Tensor" or "aten::rsqrt")."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    qname = qualified_name(node.target)
    if not qname:
        return False
    overload = getattr(aten_overload(node.target), "_overloadname", "")
    full = f"{qname}.{overload or 'default'}"
    return qname in names or full in names


#: ``aten.relu.default`` for a call, ``placeholder`` for the rest (one helper: ``edgeplug._graph.ops.op_name``)
op_label = op_name


def describe(node: Any) -> str:
    if not isinstance(node, torch.fx.Node):
        return repr(node)
    if node.op == "call_function":
        return f"node {node.name!r} ({op_label(node)})"
    return f"{node.op} {node.name!r}"


def val(node: Any) -> Optional[torch.Tensor]:
    """The (fake) tensor a node produces, from its metadata."""
    if isinstance(node, torch.fx.Node):
        v = node.meta.get("val")
        return v if isinstance(v, torch.Tensor) else None
    return None


def shape(node: Any) -> Optional[tuple[Any, ...]]:
    """Static sizes as ints, dynamic ones as their symbol's text (equal for the same symbol)."""
    v = val(node)
    if v is None:
        return None
    return tuple(s if isinstance(s, int) else str(s) for s in v.shape)


def dtype(node: Any) -> Optional[torch.dtype]:
    v = val(node)
    return v.dtype if v is not None else None


_CASTS = ("aten::_to_copy", "aten::to", "dim_order_ops::_to_dim_order_copy")
_CAST_KWARGS = {"dtype", "layout", "device", "pin_memory", "non_blocking", "memory_format", "dim_order", "copy"}


def is_cast(node: Any) -> bool:
    """A dtype conversion that keeps the shape (``.to(dtype)``, ``.float()``, edge dim-order copies)."""
    if not is_op(node, *_CASTS) or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    if set(node.kwargs) - _CAST_KWARGS:
        return False
    if any(isinstance(a, torch.fx.Node) for a in node.args[1:]):
        return False
    a, b = val(node.args[0]), val(node)
    if a is None or b is None or tuple(a.shape) != tuple(b.shape):
        return False
    device = node.kwargs.get("device")
    return device is None or torch.device(device) == a.device


def is_upcast(node: Any) -> bool:
    """A cast that loses nothing: between floating dtypes, to one that holds every value."""
    if not is_cast(node):
        return False
    src, dst = dtype(node.args[0]), dtype(node)
    return (
        src is not None
        and dst is not None
        and src.is_floating_point
        and dst.is_floating_point
        and src != dst
        and torch.promote_types(src, dst) == dst
    )


def is_pointwise(node: Any) -> bool:
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    op = aten_overload(node.target)
    return isinstance(op, torch._ops.OpOverload) and torch.Tag.pointwise in op.tags

