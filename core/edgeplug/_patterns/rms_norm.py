"""RMSNorm: ``x * rsqrt(mean(x * x, -1, keepdim=True) + eps) * w``, strictly.

``match_rms_norm(node, ep)`` is asked about every node. It recognises the
normalisation node (the multiply or divide that scales ``x`` by the inverse
RMS) or a whole ``aten.rms_norm``, and proves the match equivalent to
``rms_norm(x, [D], w, eps)`` before returning it:

* the inverse RMS is ``rsqrt(v)``, ``pow(v, -0.5)``, ``1 / sqrt(v)`` (export
  writes ``reciprocal(sqrt(v)) * 1``) or the norm is ``x / sqrt(v)``;
* ``v`` is ``mean(s, [-1] or [ndim-1], keepdim=True)`` plus an eps that is a
  finite, non-negative compile-time scalar on either side of an ``add`` with
  alpha 1 (or no eps at all: eps 0);
* ``s`` is ``t * t``, ``pow(t, 2)`` or ``square(t)`` (an exponent given as a
  constant tensor too), and ``t`` holds the same values as the normalised
  ``x`` (they may differ only by lossless upcasts);
* no quantize/dequantize sits inside the norm (a norm a quantizer annotated
  op by op is refused: quantize with ``edgeplug.quantize``, which recomposes
  the norm first);
* only casts and quantize/dequantize sit between the norm and the weight
  multiply, and the weight has shape ``[D]`` once leading 1s are dropped. A
  multiply by anything else (a scalar, a ``(1,)`` or ``(4, D)`` tensor, a
  broadcast) is not a weight: the match has no weight and names that
  multiply in ``scale_mul``, which stays as it is.

Anything else that looks like an RMSNorm is a ``NoMatch`` with the reason.
The matcher never changes the graph; ``edgeplug._fusion`` does, under a
backend's policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
from torch.export import ExportedProgram

from edgeplug._graph import ConstantAnalysis, analyze_constants, resolve_scalar
from edgeplug._graph.ops import is_dequantize
from edgeplug._patterns.base import (
    NoMatch,
    describe,
    dtype,
    dtype_name,
    is_cast,
    is_op,
    is_pointwise,
    is_qdq,
    is_upcast,
    not_candidate,
    op_label,
    shape,
)

Node = torch.fx.Node

#: How far past a non-cast op after the norm we look for the weight multiply
#: (to refuse ``relu(norm) * w`` with a reason rather than pass over it).
_WEIGHT_LOOKAHEAD = 3


@dataclass(frozen=True)
class RmsNormMatch:
    """An RMSNorm proven equivalent to ``rms_norm(input, [dim], weight, eps)``."""

    #: the normalisation node (``x * rsqrt(...)``, ``x / sqrt(...)``) or the whole ``rms_norm`` op
    anchor: Node
    #: the tensor the math normalises, in the dtype the math runs in
    input: Node
    eps: float
    #: False when the program left eps to its default (``finfo(input dtype).eps``)
    eps_given: bool
    #: D, the size of the last axis
    dim: int
    #: which spelling matched: "rsqrt", "pow(-0.5)", "1/sqrt", "x/sqrt" or "rms_norm"
    spelling: str
    #: ``input`` is this lossless cast of a lower-precision tensor (an fp32 upcast)
    upcast: Optional[Node] = None
    #: the cast back to the upcast's source dtype right after the norm
    cast_back: Optional[Node] = None
    #: the weight as written: the other operand of the weight multiply, or the op's weight
    weight: Optional[Node] = None
    #: "leaf", "computed" or "runtime" (``edgeplug._graph.weight_source``)
    weight_source: Optional[str] = None
    #: the multiply by ``weight`` (None for a whole op's own weight, or no weight)
    weight_mul: Optional[Node] = None
    #: the last node before the weight multiply: ``anchor`` or the end of the casts after it
    norm_output: Optional[Node] = None
    #: the casts and quantize/dequantize ops between the norm and the weight multiply
    between: tuple[Node, ...] = ()
    #: a multiply after the norm by something that is not a ``[D]`` weight (it stays), and why
    scale_mul: Optional[Node] = None
    scale_reason: str = ""
    #: every node the match covers, anchor first
    nodes: tuple[Node, ...] = ()

    def __bool__(self) -> bool:
        return True

    @property
    def output(self) -> Node:
        """The node whose value the whole match computes."""
        return self.weight_mul if self.weight_mul is not None else self.anchor

    @property
    def weight_in_op(self) -> bool:
        return self.weight is not None and self.weight_mul is None

    @property
    def compute_dtype(self) -> Optional[torch.dtype]:
        return dtype(self.input)


Result = Union[RmsNormMatch, NoMatch]


def match_rms_norm(node: Node, ep: ExportedProgram, *, analysis: Optional[ConstantAnalysis] = None) -> Result:
    """Match an RMSNorm whose normalisation node is ``node``.

    Returns an ``RmsNormMatch`` or a falsy ``NoMatch`` whose ``reason`` says
    what to change; ``NoMatch.candidate`` is False for nodes that are not an
    RMSNorm at all. Pass ``analysis=edgeplug._graph.analyze_constants(ep)``
    when matching many nodes of one program.
    """
    if not isinstance(node, Node) or node.op != "call_function":
        return not_candidate(node)
    if is_op(node, "aten::rms_norm"):
        return _match_whole(node, ep, analysis)
    return _match_decomposed(node, ep, analysis)


# the decomposed forms ----------------------------------------------------------


@dataclass
class _Inverse:
    """What scales ``x``: the variance node it is computed from and how."""

    variance: Any
    spelling: str
    nodes: list[Node]
    exponent: Optional[float] = None  # for pow(v, e)


def _scaled_by_inverse(node: Node, ep: ExportedProgram, qdq: list[Node]) -> Optional[tuple[Node, _Inverse]]:
    """``x * inverse_rms(v)`` or ``x / sqrt(v)``: (x, the inverse), else None."""
    if is_op(node, "aten::mul.Tensor"):
        for x, r in ((node.args[0], node.args[1]), (node.args[1], node.args[0])):
            inv = _inverse_rms(_through_qdq(r, qdq), ep)
            if inv is not None and isinstance(x, Node):
                return x, inv
            qdq.clear()
        return None
    if is_op(node, "aten::div.Tensor"):
        x, s = node.args[0], node.args[1]
        if is_op(s, "aten::sqrt") and isinstance(x, Node):
            return x, _Inverse(s.args[0], "x/sqrt", [s])
    return None


def _qdq_inside(qdq: list[Node], anchor: Node) -> NoMatch:
    names = ", ".join(repr(n.name) for n in qdq[:4]) + (", ..." if len(qdq) > 4 else "")
    return NoMatch(
        f"quantize/dequantize ops sit inside the norm ({names}): a quantizer annotated it op by op, so "
        "it cannot be fused exactly. Quantize with edgeplug.quantize so the norm is recomposed before annotation",
        anchor,
    )


def _match_decomposed(node: Node, ep: ExportedProgram, analysis: Optional[ConstantAnalysis]) -> Result:
    qdq: list[Node] = []  # quantize/dequantize pairs inside the norm (looked through, then refused)
    found = _scaled_by_inverse(node, ep, qdq)
    if found is None:
        return not_candidate(node)
    x, inv = found
    if shape(x) is None or shape(x) != shape(node):
        # the scale of ``reciprocal(...) * 1`` or a broadcast: not a normalised tensor
        return not_candidate(node)

    variance = _split_variance(_through_qdq(inv.variance, qdq), qdq)
    if variance is None:
        # x * rsqrt(something that is not a mean): not an RMSNorm at all
        return not_candidate(node, f"{describe(node)} does not scale by the inverse of a mean")
    mean, eps_operand, add = variance
    covered: list[Node] = [node, *inv.nodes, *([add] if add is not None else []), mean]

    # from here on the node looks like an RMSNorm: every refusal is reported
    if inv.spelling == "pow" and inv.exponent != -0.5:
        return NoMatch(f"the inverse RMS is pow(v, {inv.exponent}); RMSNorm needs pow(v, -0.5)", node)
    if inv.spelling == "pow":
        inv.spelling = "pow(-0.5)"

    eps = _eps_of(add, eps_operand, ep, analysis, node)
    if isinstance(eps, NoMatch):
        return eps

    t = _check_mean(mean, node, ep, qdq)
    if isinstance(t, NoMatch):
        return t
    square = mean.args[0]
    covered.append(square)

    chosen = _same_values(*_without_qdq_between(x, t, qdq), node)
    if isinstance(chosen, NoMatch):
        return chosen
    if qdq:
        return _qdq_inside(qdq, node)
    dims = shape(chosen)
    if not dims or not isinstance(dims[-1], int):
        return NoMatch(f"the last axis of {describe(chosen)} is not static ({dims}); its size must be known", node)
    if shape(node) != dims:
        return NoMatch(
            f"the normalised output has shape {shape(node)}, the input {dims}: the scale broadcasts", node
        )
    return _with_weight(
        ep,
        analysis,
        anchor=node,
        input=chosen,
        eps=eps,
        eps_given=True,
        dim=dims[-1],
        spelling=inv.spelling,
        covered=covered,
    )


def inverse_rms_of_mean(node: Node, ep: ExportedProgram) -> bool:
    """``node`` is ``rsqrt(mean(...) + eps)`` or another spelling of it: the core of a norm.

    The fusion reports such a node when nothing that scales by it matched
    (every norm accounted for), so ``x * rsqrt(v).to(bf16)`` is not silent.
    """
    if is_op(node, "aten::mul.Tensor"):  # ``r * 1``: the inverse is what it multiplies
        return False
    inv = _inverse_rms(node, ep)
    return inv is not None and _split_variance(_through_qdq(inv.variance, []), []) is not None


def _inverse_rms(r: Any, ep: ExportedProgram) -> Optional[_Inverse]:
    """``rsqrt(v)``, ``pow(v, e)``, ``reciprocal(sqrt(v))`` or ``1 / sqrt(v)``, times 1 any number of times."""
    nodes: list[Node] = []
    # ``1 / sqrt(v)`` exports as ``reciprocal(sqrt(v)) * 1``
    while is_op(r, "aten::mul.Tensor"):
        a, b = r.args[0], r.args[1]
        if isinstance(a, Node) and _is_one(b, ep) and shape(r) == shape(a) and dtype(r) == dtype(a):
            nodes.append(r)
            r = a
        elif isinstance(b, Node) and _is_one(a, ep) and shape(r) == shape(b) and dtype(r) == dtype(b):
            nodes.append(r)
            r = b
        else:
            break
    if is_op(r, "aten::rsqrt"):
        return _Inverse(r.args[0], "rsqrt", [*nodes, r])
    if is_op(r, "aten::pow.Tensor_Scalar", "aten::pow.Tensor_Tensor"):
        e = resolve_scalar(r.args[1], ep)
        if is_op(r, "aten::pow.Tensor_Tensor") and (e is None or shape(r) != shape(r.args[0])):
            return None
        return _Inverse(r.args[0], "pow", [*nodes, r], exponent=e)
    if is_op(r, "aten::reciprocal") and is_op(r.args[0], "aten::sqrt"):
        return _Inverse(r.args[0].args[0], "1/sqrt", [*nodes, r, r.args[0]])
    if is_op(r, "aten::div.Tensor") and is_op(r.args[1], "aten::sqrt") and _is_one(r.args[0], ep):
        return _Inverse(r.args[1].args[0], "1/sqrt", [*nodes, r, r.args[1]])
    return None


def _is_one(v: Any, ep: ExportedProgram) -> bool:
    return resolve_scalar(v, ep) == 1


def _is_quantize(node: Any) -> bool:
    return is_qdq(node) and not is_dequantize(node.target)


def _through_qdq(node: Any, seen: list[Node]) -> Any:
    """Follow ``dequantize(quantize(v))`` back to ``v``, adding the pairs passed to ``seen``."""
    while is_qdq(node) and is_dequantize(node.target) and node.args and _is_quantize(node.args[0]):
        seen.extend((node, node.args[0]))
        node = node.args[0].args[0]
    return node


def _without_qdq_between(a: Any, b: Any, qdq: list[Node]) -> tuple[Any, Any]:
    """``a`` and ``b``, looked through the quantize/dequantize that alone tells them apart.

    The norm's input may be quantized (one tensor both squared and
    normalised); a quantize/dequantize on one path only sits inside the norm.
    """
    if a is b:
        return a, b
    seen: list[Node] = []
    a2, b2 = _through_qdq(a, seen), _through_qdq(b, seen)
    if seen and _strip(a2, is_upcast) is _strip(b2, is_upcast):
        qdq.extend(seen)
        return a2, b2
    return a, b


def _split_variance(v: Any, qdq: list[Node]) -> Optional[tuple[Node, Any, Optional[Node]]]:
    """``mean(...) + eps`` (either order), or a bare ``mean(...)``: (mean, eps operand, add)."""
    if is_op(v, "aten::mean.dim"):
        return v, None, None
    if is_op(v, "aten::add.Tensor", "aten::add.Scalar", "aten::sub.Tensor", "aten::sub.Scalar"):
        a, b = _through_qdq(v.args[0], qdq), _through_qdq(v.args[1], qdq)
        if is_op(a, "aten::mean.dim"):
            return a, b, v
        if is_op(b, "aten::mean.dim") and is_op(v, "aten::add.Tensor", "aten::add.Scalar"):
            return b, a, v
    return None


def _eps_of(
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


def _check_mean(
    mean: Node, anchor: Node, ep: Optional[ExportedProgram] = None, qdq: Optional[list[Node]] = None
) -> Union[Node, NoMatch]:
    """The mean reduces the last axis only, keeping it; returns the tensor squared."""
    qdq = qdq if qdq is not None else []
    src = _through_qdq(mean.args[0], qdq)
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
            a, b = _without_qdq_between(a, b, qdq)
        if a is b and isinstance(a, Node):
            return a
        if (
            isinstance(a, Node)
            and isinstance(b, Node)
            and _strip(a, is_upcast) is _strip(b, is_upcast)
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


def _strip(node: Any, pred) -> Any:
    while pred(node):
        node = node.args[0]
    return node


def _first_cast(node: Any, pred) -> Optional[Node]:
    while is_cast(node):
        if pred(node):
            return node
        node = node.args[0]
    return None


def _same_values(x: Node, t: Node, anchor: Node) -> Union[Node, NoMatch]:
    """``x`` (normalised) and ``t`` (squared) hold the same values; returns the one in the math's dtype."""
    if not isinstance(t, Node):
        return NoMatch(f"the squared operand {describe(t)} is not a tensor of the graph", anchor)
    if x is not t and _strip(x, is_upcast) is not _strip(t, is_upcast):
        if _strip(x, is_cast) is _strip(t, is_cast):
            down = _first_cast(x, lambda n: not is_upcast(n)) or _first_cast(t, lambda n: not is_upcast(n))
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


# the whole op ----------------------------------------------------------------


def _arg(node: Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _match_whole(node: Node, ep: ExportedProgram, analysis: Optional[ConstantAnalysis]) -> Result:
    x = _arg(node, 0, "input")
    normalized_shape = list(_arg(node, 1, "normalized_shape", []) or [])
    weight = _arg(node, 2, "weight")
    eps = _arg(node, 3, "eps")
    dims = shape(x)
    if not isinstance(x, Node) or not dims or not isinstance(dims[-1], int):
        return NoMatch(f"the last axis of the input of {describe(node)} is not static ({dims})", node)
    if len(normalized_shape) != 1:
        return NoMatch(
            f"normalized_shape {normalized_shape} spans {len(normalized_shape)} axes; only the last axis is fused",
            node,
        )
    if normalized_shape[0] != dims[-1]:
        return NoMatch(f"normalized_shape {normalized_shape} does not match the last axis ({dims[-1]})", node)
    eps_given = eps is not None
    if eps is None:
        # aten's default: the machine epsilon of the (logical) input dtype
        eps_value = float(torch.finfo(dtype(x)).eps)
    else:
        resolved = resolve_scalar(eps, ep)
        if resolved is None:
            return NoMatch(f"eps of {describe(node)} ({describe(eps)}) is not a compile-time scalar", node)
        eps_value = float(resolved)
        if not math.isfinite(eps_value) or eps_value < 0:
            return NoMatch(f"eps is {eps_value!r}; it must be finite and non-negative", node)
    if weight is not None:
        if not isinstance(weight, Node):
            return NoMatch(f"the weight of {describe(node)} is {weight!r}, not a tensor", node)
        if shape(weight) != (dims[-1],):
            return NoMatch(f"weight {weight.name!r} has shape {shape(weight)}, not ({dims[-1]},)", node)
        analysis = analysis or analyze_constants(ep)
        return _finish(
            anchor=node,
            input=x,
            eps=eps_value,
            eps_given=eps_given,
            dim=dims[-1],
            spelling="rms_norm",
            covered=[node],
            weight=weight,
            weight_source=analysis.source(weight),
            norm_output=node,
        )
    return _with_weight(
        ep, analysis, anchor=node, input=x, eps=eps_value, eps_given=eps_given, dim=dims[-1],
        spelling="rms_norm", covered=[node],
    )


# the weight multiply -----------------------------------------------------------


def _with_weight(
    ep: ExportedProgram,
    analysis: Optional[ConstantAnalysis],
    *,
    anchor: Node,
    covered: list[Node],
    dim: int,
    **fields: Any,
) -> Result:
    """Find the weight multiply after the norm (through casts and q/dq only) and check it."""
    cur, between = anchor, []
    while len(cur.users) == 1:
        (user,) = cur.users
        if not (is_cast(user) or is_qdq(user)):
            break
        between.append(user)
        cur = user
    users = list(cur.users)
    mul = users[0] if len(users) == 1 and is_op(users[0], "aten::mul.Tensor") else None
    if mul is not None:
        others = [a for a in mul.args[:2] if a is not cur]
        if len(others) != 1:  # norm * norm: not a weight
            mul = None
    if mul is None:
        blocker = _op_before_weight(anchor, dim)
        if blocker is not None:
            op, weight_mul = blocker
            return NoMatch(
                f"op {op_label(op)} ({op.name!r}) sits between the norm and the weight multiply "
                f"{weight_mul.name!r}; only casts and quantize/dequantize may sit there",
                anchor,
            )
        return _finish(anchor=anchor, covered=covered, dim=dim, norm_output=anchor, **fields)

    weight = others[0]
    not_a_weight = _not_a_weight(weight, mul, cur, dim)
    if not_a_weight:
        # a scale, not a weight: the norm is still a norm; the multiply stays as it is
        return _finish(
            anchor=anchor, covered=covered, dim=dim, norm_output=anchor, scale_mul=mul, scale_reason=not_a_weight,
            **fields,
        )
    analysis = analysis or analyze_constants(ep)
    return _finish(
        anchor=anchor,
        covered=[*covered, *between, mul],
        dim=dim,
        weight=weight,
        weight_source=analysis.source(weight),
        weight_mul=mul,
        norm_output=cur,
        between=between,
        **fields,
    )


def _not_a_weight(weight: Any, mul: Node, cur: Node, dim: int) -> str:
    """Why the other operand of the multiply after the norm is not a ``[D]`` weight ("" if it is one)."""
    if not isinstance(weight, Node):
        return f"the multiply {mul.name!r} after the norm takes {weight!r}, not a weight of shape ({dim},)"
    w_shape = shape(weight)
    if w_shape is None or _drop_leading_ones(w_shape) != (dim,):
        return f"weight {weight.name!r} has shape {w_shape}, not ({dim},)"
    if shape(mul) != shape(cur):
        return f"the weight multiply {mul.name!r} broadcasts the output from {shape(cur)} to {shape(mul)}"
    return ""


def _drop_leading_ones(dims: tuple[int, ...]) -> tuple[int, ...]:
    i = 0
    while i < len(dims) - 1 and dims[i] == 1:
        i += 1
    return tuple(dims[i:])


def _op_before_weight(anchor: Node, dim: int) -> Optional[tuple[Node, Node]]:
    """``relu(norm) * w``: the first non-cast op on the way to a multiply by a ``[D]`` tensor."""
    cur, blocker = anchor, None
    for _ in range(_WEIGHT_LOOKAHEAD + 1):
        if len(cur.users) != 1:
            return None
        (user,) = cur.users
        if blocker is not None and is_op(user, "aten::mul.Tensor"):
            others = [a for a in user.args[:2] if a is not cur]
            if len(others) == 1 and isinstance(others[0], Node):
                w_shape = shape(others[0])
                if w_shape is not None and _drop_leading_ones(w_shape) == (dim,):
                    return blocker, user
            return None
        if is_cast(user) or is_qdq(user):
            cur = user
            continue
        if not is_pointwise(user) or shape(user) != shape(anchor):
            return None
        blocker = blocker or user
        cur = user
    return None


def _finish(
    *,
    anchor: Node,
    input: Node,
    covered: list[Node],
    between: tuple[Node, ...] | list[Node] = (),
    **fields: Any,
) -> RmsNormMatch:
    upcast = input if is_upcast(input) else None
    cast_back = None
    if upcast is not None:
        source_dtype = dtype(upcast.args[0])
        after = list(between) or [u for u in anchor.users if is_cast(u)][:1]
        if after and is_cast(after[0]) and dtype(after[0]) == source_dtype and len(anchor.users) == 1:
            cast_back = after[0]
    return RmsNormMatch(
        anchor=anchor,
        input=input,
        upcast=upcast,
        cast_back=cast_back,
        nodes=tuple(dict.fromkeys(covered)),
        between=tuple(between),
        **fields,
    )
