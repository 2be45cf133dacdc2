"""Copies that change nothing (``is_identity_copy``).

``to_edge`` leaves layout-only copies in a program: ``clone`` (as
``_clone_dim_order``), ``alias_copy``, ``lift_fresh_copy``, a dim-order or
dtype conversion to what the tensor already is, an ``expand_copy`` to the
shape it has. A backend whose real flow removes them before partitioning
(QNN's own pass manager does) chooses the rewrite ``drop_identity_copies``
(``edgeplug._graph.canonical``), so partitions and the report are those of the
real flow, not broken by copies no device would run.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from edgeplug._graph.ops import qualified_name

#: ops whose output equals their first argument whatever the arguments
_ALWAYS = frozenset({"aten::alias", "aten::alias_copy", "aten::lift_fresh_copy"})
#: ops whose output equals their first argument when dtype, shape and dim order are kept
_WHEN_UNCHANGED = frozenset(
    {
        "aten::clone",
        "dim_order_ops::_clone_dim_order",
        "aten::_to_copy",
        "dim_order_ops::_to_dim_order_copy",
        "aten::expand_copy",
    }
)


def _val(node: Any) -> Optional[torch.Tensor]:
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _dim_order(t: torch.Tensor) -> Optional[tuple[int, ...]]:
    try:
        return tuple(t.dim_order())
    except Exception:  # ambiguous strides (size-1 dims) or symbolic ones
        return None


def is_identity_copy(node: torch.fx.Node) -> bool:
    """``node`` copies its first argument unchanged (same values, dtype, shape, dim order, device)."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    name = qualified_name(node.target)
    if name not in _ALWAYS and name not in _WHEN_UNCHANGED:
        return False
    src, out = _val(node.args[0]), _val(node)
    if src is None or out is None:
        return False
    if src.dtype != out.dtype or src.device != out.device or tuple(src.shape) != tuple(out.shape):
        return False
    return name in _ALWAYS or (_dim_order(src) is not None and _dim_order(src) == _dim_order(out))

