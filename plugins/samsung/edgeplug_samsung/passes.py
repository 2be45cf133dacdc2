"""Samsung's export-stage passes: decompositions ENN needs before lowering.

Both add nodes to a program torch.export named, so they rely on the core's
pass runner reserving the names that exist (pytorch#202927): with an input
named ``cat``, the ``cat`` that ``roll`` becomes would otherwise take a name
already in use.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch.export import ExportedProgram

from edgeplug.plugin import aten_overload, replace_with_traced

_ROLL = {torch.ops.aten.roll.default}
_REMAINDER = {torch.ops.aten.remainder.Tensor, torch.ops.aten.remainder.Scalar, torch.ops.aten.remainder.Scalar_Tensor}


def _as_list(v) -> list:
    if v is None:
        return []
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _roll(x: torch.Tensor, shifts: Sequence[int], dims: Sequence[int]) -> torch.Tensor:
    if not dims:  # roll over the flattened tensor
        return _roll(x.reshape(-1), shifts, [0]).reshape(x.shape)
    for shift, dim in zip(shifts, dims, strict=True):
        n = x.shape[dim]
        shift %= n
        if shift:
            x = torch.cat((x.narrow(dim, n - shift, shift), x.narrow(dim, 0, n - shift)), dim=dim)
    return x


def _remainder(x, y):
    # Python's modulo, the sign of the divisor: x - floor(x / y) * y
    if isinstance(x, torch.Tensor) and not x.is_floating_point() and not (isinstance(y, torch.Tensor) and y.is_floating_point()) and not isinstance(y, float):
        return x - torch.div(x, y, rounding_mode="floor") * y
    return x - torch.floor(x / y) * y


def decompose_roll(ep: ExportedProgram) -> None:
    """``roll`` as slices and a ``cat`` (ENN has no roll)."""
    for node in list(ep.graph.nodes):
        if node.op == "call_function" and aten_overload(node.target) in _ROLL:
            x = node.args[0]
            shifts = _as_list(node.args[1] if len(node.args) > 1 else node.kwargs.get("shifts"))
            dims = _as_list(node.args[2] if len(node.args) > 2 else node.kwargs.get("dims"))
            replace_with_traced(node, lambda t, s=shifts, d=dims: _roll(t, s, d), [x])


def decompose_remainder(ep: ExportedProgram) -> None:
    """``remainder`` as ``x - floor(x / y) * y`` (ENN has no remainder)."""
    for node in list(ep.graph.nodes):
        if node.op == "call_function" and aten_overload(node.target) in _REMAINDER:
            replace_with_traced(node, _remainder, list(node.args[:2]))
