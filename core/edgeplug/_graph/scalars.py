"""The compile-time value of a scalar operand (an eps, an exponent, a scale)."""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch.export import ExportedProgram

from edgeplug._graph.constants import _get_attr, constant_value, mutated_targets
from edgeplug._graph.ops import is_dequantize, is_written, qualified_name

Scalar = Union[int, float, bool]

#: Ops export (or to_edge) leaves around a constant without changing its value
#: beyond a dtype cast; evaluated on the real tensor so casts round exactly.
_WRAPPERS = frozenset(
    {
        "aten::detach",
        "aten::detach_",
        "aten::detach_copy",
        "aten::lift_fresh",
        "aten::lift_fresh_copy",
        "aten::clone",
        "aten::_to_copy",
        "aten::to",
        "aten::alias",
        "aten::alias_copy",
        "dim_order_ops::_to_dim_order_copy",
        "dim_order_ops::_clone_dim_order",
        "aten::scalar_tensor",
        "aten::_local_scalar_dense",
        "aten::item",
    }
)


def resolve_scalar(node_or_value: Any, ep: Optional[ExportedProgram] = None) -> Optional[Scalar]:
    """The compile-time value of a scalar operand, or None when it has none.

    Resolves Python literals; 0-d tensors; parameters, buffers and lifted
    constants of ``ep`` holding a 0-d tensor; the wrappers export leaves
    around them (``detach``, ``lift_fresh_copy``, ``clone``, ``to``/``_to_copy``,
    ``alias`` and their edge forms); a dequantize of a resolvable constant; and
    nodes export itself specialised to a plain Python number. A user input,
    a buffer the program mutates, a random op or anything computed is None.
    """
    mutated = mutated_targets(ep) if ep is not None else frozenset()
    value = _scalar_of(node_or_value, ep, mutated, depth=0)
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.is_complex():
            return None
        return value.item()
    return value


def _literal(v: Any) -> Optional[Scalar]:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return v
    return None


def _scalar_of(v: Any, ep: Optional[ExportedProgram], mutated: frozenset, depth: int) -> Any:
    """A Python scalar, a 0-d constant tensor, or None."""
    if isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, torch.Tensor):
        return v if v.dim() == 0 and not isinstance(v, torch._subclasses.FakeTensor) else None
    if not isinstance(v, torch.fx.Node) or depth > 64 or is_written(v):
        return None
    if v.op == "placeholder":
        if ep is None:
            return None
        spec = next((s for s in ep.graph_signature.input_specs if s.arg.name == v.name), None)
        if spec is None or spec.target in mutated:
            return None
        value = constant_value(ep, v)
        return value if isinstance(value, torch.Tensor) and value.dim() == 0 else None
    if v.op == "get_attr":
        value = _get_attr(v)
        return value if isinstance(value, torch.Tensor) and value.dim() == 0 else None
    if v.op != "call_function":
        return None
    if qualified_name(v.target) in _WRAPPERS or is_dequantize(v.target):
        if any(isinstance(k, torch.fx.Node) for k in v.kwargs.values()):
            return None
        args = []
        for a in v.args:
            if isinstance(a, torch.fx.Node):
                a = _scalar_of(a, ep, mutated, depth + 1)
                if a is None:
                    return None
            args.append(a)
        with torch.no_grad():
            try:
                out = v.target(*args, **v.kwargs)
            except Exception:  # an op that refuses the real value is not a constant we can use
                return None
        return out if isinstance(out, torch.Tensor) and out.dim() == 0 else _literal(out)
    # export specialises some scalar computations to plain numbers in metadata
    return _literal(v.meta.get("val"))
