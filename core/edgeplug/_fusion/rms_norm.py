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
Each proof is a guard of ``edgeplug._fusion.rms_norm_guards``; this module
finds the candidate and puts them together. ``find_rms_norms(ep)`` is fusion's match phase: every
node of a program asked once, against one constant analysis, and every ``rsqrt(mean(...) + eps)``
no match covers accounted for. The matcher never changes the graph; ``edgeplug._fusion.program``
does, under a backend's policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
from torch.fx import Node
from torch.export import ExportedProgram

from edgeplug._fusion.nodes import (
    ConstantAnalysis,
    NoMatch,
    analyze_constants,
    describe,
    dtype,
    is_cast,
    is_op,
    is_pointwise,
    is_qdq,
    is_upcast,
    not_candidate,
    op_label,
    resolve_scalar,
    shape,
)
from edgeplug._records import FusionRecord
from edgeplug._fusion.rms_norm_guards import (
    check_mean,
    eps_of,
    inverse_rms,
    qdq_inside,
    same_values,
    scaled_by_inverse,
    split_variance,
    through_qdq,
    without_qdq_between,
)


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


def find_rms_norms(ep: ExportedProgram) -> list[Union[RmsNormMatch, FusionRecord]]:
    """Fusion's match phase: a match for every RMSNorm of ``ep``, in graph order, and a rejection
    record for every candidate a guard refused; then one for each inverse RMS no match covers."""
    analysis = analyze_constants(ep)
    found: list[Union[RmsNormMatch, FusionRecord]] = []
    accounted: set[Node] = set()
    for node in ep.graph_module.graph.nodes:
        m = match_rms_norm(node, ep, analysis=analysis)
        if isinstance(m, RmsNormMatch):
            found.append(m)
            accounted.update(m.nodes)
        elif m.candidate:
            found.append(FusionRecord(pattern="rms_norm", anchor=node.name, outcome="rejected", reason=m.reason))
            accounted.add(node)
    return found + _unaccounted_norms(ep, accounted)


def _unaccounted_norms(ep: ExportedProgram, accounted: set[Node]) -> list[FusionRecord]:
    """A record for every ``rsqrt(mean(...) + eps)`` no match or refusal covers: every norm accounted for."""
    records = []
    for node in ep.graph_module.graph.nodes:
        if node in accounted or not inverse_rms_of_mean(node, ep):
            continue
        near, frontier = set(), [node]
        for _ in range(3):  # through the casts and ``* 1`` between the inverse and what it scales
            frontier = [u for n in frontier for u in n.users]
            near.update(frontier)
        if near & accounted:
            continue
        users = ", ".join(describe(u) for u in node.users) or "nothing"
        reason = (
            f"{describe(node)} is the inverse RMS of a mean, but what it scales ({users}) is not a norm the matcher "
            "recognises (e.g. the inverse is cast before it scales the input): left as it is"
        )
        records.append(FusionRecord(pattern="rms_norm", anchor=node.name, outcome="rejected", reason=reason))
    return records


# the decomposed forms ----------------------------------------------------------


def _match_decomposed(node: Node, ep: ExportedProgram, analysis: Optional[ConstantAnalysis]) -> Result:
    qdq: list[Node] = []  # quantize/dequantize pairs inside the norm (looked through, then refused)
    found = scaled_by_inverse(node, ep, qdq)
    if found is None:
        return not_candidate(node)
    x, inv = found
    if shape(x) is None or shape(x) != shape(node):
        # the scale of ``reciprocal(...) * 1`` or a broadcast: not a normalised tensor
        return not_candidate(node)

    variance = split_variance(through_qdq(inv.variance, qdq), qdq)
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

    eps = eps_of(add, eps_operand, ep, analysis, node)
    if isinstance(eps, NoMatch):
        return eps

    t = check_mean(mean, node, ep, qdq)
    if isinstance(t, NoMatch):
        return t
    square = mean.args[0]
    covered.append(square)

    chosen = same_values(*without_qdq_between(x, t, qdq), node)
    if isinstance(chosen, NoMatch):
        return chosen
    if qdq:
        return qdq_inside(qdq, node)
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
    inv = inverse_rms(node, ep)
    return inv is not None and split_variance(through_qdq(inv.variance, []), []) is not None




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
