"""The guards that prove an RMSNorm match equivalent to ``rms_norm(x, [D], w, eps)``.

Each takes a piece of the candidate (the inverse RMS, the variance, the mean,
eps, the squared and the normalised tensors) and returns what it proved (a
node, a value) or a ``NoMatch`` naming what is wrong; ``edgeplug._fusion.rms_norm``
(the matcher) puts them together. Quantize/dequantize pairs are looked
through only where they cannot change what the norm computes, and every pair
passed is added to the caller's ``qdq`` list (a pair inside the norm refuses it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Union

from torch.fx import Node
from torch.export import ExportedProgram

from edgeplug._fusion.nodes import (
    ConstantAnalysis,
    NoMatch,
    analyze_constants,
    describe,
    dtype,
    dtype_name,
    is_cast,
    is_dequantize,
    is_op,
    is_qdq,
    is_upcast,
    resolve_scalar,
    shape,
)



@dataclass
class Inverse:
    """What scales ``x``: the variance node it is computed from and how."""

    variance: Any
    spelling: str
    nodes: list[Node]
    exponent: Optional[float] = None  # for pow(v, e)


def scaled_by_inverse(node: Node, ep: ExportedProgram, qdq: list[Node]) -> Optional[tuple[Node, Inverse]]:
    """``x * inverse_rms(v)`` or ``x / sqrt(v)``: (x, the inverse), else None."""
    if is_op(node, "aten::mul.Tensor"):
        for x, r in ((node.args[0], node.args[1]), (node.args[1], node.args[0])):
            inv = inverse_rms(through_qdq(r, qdq), ep)
            if inv is not None and isinstance(x, Node):
                return x, inv
            qdq.clear()
        return None
    if is_op(node, "aten::div.Tensor"):
        x, s = node.args[0], node.args[1]
        if is_op(s, "aten::sqrt") and isinstance(x, Node):
            return x, Inverse(s.args[0], "x/sqrt", [s])
    return None


def qdq_inside(qdq: list[Node], anchor: Node) -> NoMatch:
    names = ", ".join(repr(n.name) for n in qdq[:4]) + (", ..." if len(qdq) > 4 else "")
    return NoMatch(
        f"quantize/dequantize ops sit inside the norm ({names}): a quantizer annotated it op by op, so "
        "it cannot be fused exactly. Quantize with edgeplug.quantize so the norm is recomposed before annotation",
        anchor,
    )



def inverse_rms(r: Any, ep: ExportedProgram) -> Optional[Inverse]:
    """``rsqrt(v)``, ``pow(v, e)``, ``reciprocal(sqrt(v))`` or ``1 / sqrt(v)``, times 1 any number of times."""
    nodes: list[Node] = []
    # ``1 / sqrt(v)`` exports as ``reciprocal(sqrt(v)) * 1``
    while is_op(r, "aten::mul.Tensor"):
        a, b = r.args[0], r.args[1]
        if isinstance(a, Node) and is_one(b, ep) and shape(r) == shape(a) and dtype(r) == dtype(a):
            nodes.append(r)
            r = a
        elif isinstance(b, Node) and is_one(a, ep) and shape(r) == shape(b) and dtype(r) == dtype(b):
            nodes.append(r)
            r = b
        else:
            break
    if is_op(r, "aten::rsqrt"):
        return Inverse(r.args[0], "rsqrt", [*nodes, r])
    if is_op(r, "aten::pow.Tensor_Scalar", "aten::pow.Tensor_Tensor"):
        e = resolve_scalar(r.args[1], ep)
        if is_op(r, "aten::pow.Tensor_Tensor") and (e is None or shape(r) != shape(r.args[0])):
            return None
        return Inverse(r.args[0], "pow", [*nodes, r], exponent=e)
    if is_op(r, "aten::reciprocal") and is_op(r.args[0], "aten::sqrt"):
        return Inverse(r.args[0].args[0], "1/sqrt", [*nodes, r, r.args[0]])
    if is_op(r, "aten::div.Tensor") and is_op(r.args[1], "aten::sqrt") and is_one(r.args[0], ep):
        return Inverse(r.args[1].args[0], "1/sqrt", [*nodes, r, r.args[1]])
    return None


def is_one(v: Any, ep: ExportedProgram) -> bool:
    return resolve_scalar(v, ep) == 1


def is_quantize(node: Any) -> bool:
    return is_qdq(node) and not is_dequantize(node.target)


def through_qdq(node: Any, seen: list[Node]) -> Any:
    """Follow ``dequantize(quantize(v))`` back to ``v``, adding the pairs passed to ``seen``."""
    while is_qdq(node) and is_dequantize(node.target) and node.args and is_quantize(node.args[0]):
        seen.extend((node, node.args[0]))
        node = node.args[0].args[0]
    return node


def without_qdq_between(a: Any, b: Any, qdq: list[Node]) -> tuple[Any, Any]:
    """``a`` and ``b``, looked through the quantize/dequantize that alone tells them apart.

    The norm's input may be quantized (one tensor both squared and
    normalised); a quantize/dequantize on one path only sits inside the norm.
    """
    if a is b:
        return a, b
    seen: list[Node] = []
    a2, b2 = through_qdq(a, seen), through_qdq(b, seen)
    if seen and strip_while(a2, is_upcast) is strip_while(b2, is_upcast):
        qdq.extend(seen)
        return a2, b2
    return a, b


def split_variance(v: Any, qdq: list[Node]) -> Optional[tuple[Node, Any, Optional[Node]]]:
    """``mean(...) + eps`` (either order), or a bare ``mean(...)``: (mean, eps operand, add)."""
    if is_op(v, "aten::mean.dim"):
        return v, None, None
    if is_op(v, "aten::add.Tensor", "aten::add.Scalar", "aten::sub.Tensor", "aten::sub.Scalar"):
        a, b = through_qdq(v.args[0], qdq), through_qdq(v.args[1], qdq)
        if is_op(a, "aten::mean.dim"):
            return a, b, v
        if is_op(b, "aten::mean.dim") and is_op(v, "aten::add.Tensor", "aten::add.Scalar"):
            return b, a, v
    return None


def eps_of(
    add: Optional[Node], operand: Any, ep: ExportedProgram, analysis: Optional[ConstantAnalysis], anchor: Node
) -> Union[float, NoMatch]:
    if add is None:
        return 0.0
    alpha = add.kwargs.get("alpha", add.args[2] if len(add.args) > 2 else 1)
    alpha_value = resolve_scalar(alpha, ep)
    if alpha_value != 1:
        shown = alpha_value if alpha_value is not None else describe(alpha)
        return NoMatch(f"{describe(add)} has alpha={shown}; only alpha=1 adds eps as written", anchor)
    if isinstance(operand, Node):
        analysis = analysis or analyze_constants(ep)
        if analysis.source(operand) == "runtime":
            return NoMatch(f"eps comes from {describe(operand)}, computed at runtime; it must be a constant", anchor)
    value = resolve_scalar(operand, ep)
    if value is None or isinstance(value, bool):
        return NoMatch(
            f"eps ({describe(operand)}) is not a compile-time scalar (a 0-d constant or a literal)", anchor
        )
    value = float(value)
    if is_op(add, "aten::sub.Tensor", "aten::sub.Scalar"):
        value = -value  # mean - c adds eps = -c
    if not math.isfinite(value) or value < 0:
        return NoMatch(f"eps is {value!r}; it must be finite and non-negative", anchor)
    if shape(add) is not None and shape(add) != shape(add.args[0] if add.args[0] is not operand else add.args[1]):
        return NoMatch(f"adding eps changes the shape to {shape(add)}", anchor)
    return value


def check_mean(
    mean: Node, anchor: Node, ep: Optional[ExportedProgram] = None, qdq: Optional[list[Node]] = None
) -> Union[Node, NoMatch]:
    """The mean reduces the last axis only, keeping it; returns the tensor squared."""
    qdq = qdq if qdq is not None else []
    src = through_qdq(mean.args[0], qdq)
    dims = mean.args[1] if len(mean.args) > 1 else mean.kwargs.get("dim")
    keepdim = mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False)
    in_shape = shape(src)
    ndim = len(in_shape) if in_shape is not None else None
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return NoMatch(f"{describe(mean)} reduces every axis; RMSNorm reduces the last axis only", anchor)
    dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
    if len(dims) != 1:
        return NoMatch(f"{describe(mean)} reduces axes {dims}; RMSNorm reduces the last axis only", anchor)
    if ndim is None or dims[0] not in (-1, ndim - 1):
        last = f"-1 or {ndim - 1}" if ndim is not None else "-1"
        return NoMatch(f"{describe(mean)} reduces axis {dims[0]}, not the last axis ({last})", anchor)
    if not keepdim:
        return NoMatch(f"{describe(mean)} has keepdim=False; the norm needs keepdim=True to broadcast", anchor)
    if mean.kwargs.get("dtype") is not None:
        return NoMatch(f"{describe(mean)} accumulates in {dtype_name(mean.kwargs['dtype'])} (dtype=...)", anchor)
    if is_op(src, "aten::mul.Tensor"):
        a, b = src.args[0], src.args[1]
        if a is not b:
            a, b = without_qdq_between(a, b, qdq)
        if a is b and isinstance(a, Node):
            return a
        if (
            isinstance(a, Node)
            and isinstance(b, Node)
            and strip_while(a, is_upcast) is strip_while(b, is_upcast)
            and dtype(a) == dtype(b)
        ):
            return a
        return NoMatch(f"{describe(src)} multiplies {describe(a)} by {describe(b)}: not a square", anchor)
    if is_op(src, "aten::pow.Tensor_Scalar", "aten::pow.Tensor_Tensor"):
        # pow.Tensor_Tensor: a quantizer's annotation pipeline writes pow(x, 2) with a constant tensor 2
        e = resolve_scalar(src.args[1], ep)
        if e is None or shape(src) != shape(src.args[0]):
            return NoMatch(f"{describe(src)} raises to {describe(src.args[1])}, not a compile-time scalar", anchor)
        if e != 2:
            return NoMatch(f"{describe(src)} raises to the power {e}; RMSNorm squares", anchor)
        return src.args[0]
    if is_op(src, "aten::square"):
        return src.args[0]
    return NoMatch(f"the mean is over {describe(src)}, not over a square", anchor)


def strip_while(node: Any, pred) -> Any:
    while pred(node):
        node = node.args[0]
    return node


def first_cast(node: Any, pred) -> Optional[Node]:
    while is_cast(node):
        if pred(node):
            return node
        node = node.args[0]
    return None


def same_values(x: Node, t: Node, anchor: Node) -> Union[Node, NoMatch]:
    """``x`` (normalised) and ``t`` (squared) hold the same values; returns the one in the math's dtype."""
    if not isinstance(t, Node):
        return NoMatch(f"the squared operand {describe(t)} is not a tensor of the graph", anchor)
    if x is not t and strip_while(x, is_upcast) is not strip_while(t, is_upcast):
        if strip_while(x, is_cast) is strip_while(t, is_cast):
            down = first_cast(x, lambda n: not is_upcast(n)) or first_cast(t, lambda n: not is_upcast(n))
            return NoMatch(
                f"{describe(down)} casts to {dtype_name(dtype(down))} before the math, so the squared and "
                "the normalised tensors differ; cast after the norm instead",
                anchor,
            )
        return NoMatch(f"squares {describe(t)} but normalises {describe(x)}: different tensors", anchor)
    compute = dtype(anchor)
    if dtype(t) != compute:
        return NoMatch(
            f"squares in {dtype_name(dtype(t))} but the norm is in {dtype_name(compute)}; "
            "the mean must run in the norm's dtype",
            anchor,
        )
    return t if dtype(x) != compute else x


__all__ = [
    "Inverse", "check_mean", "eps_of", "first_cast", "inverse_rms", "is_one", "is_quantize", "qdq_inside", "same_values",
    "scaled_by_inverse", "split_variance", "strip_while", "through_qdq", "without_qdq_between",
]
