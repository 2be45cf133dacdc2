"""Deciding each match: what the fused op's weight is, and the outcome (pure).

``decide_fusion(match, fused_op)`` looks at one ``RmsNormMatch`` and the policy
behind ``fused_op`` and changes nothing. A ``Decision`` says what the
rewrite will do:

* ``weight="as_is"``: the matched weight is the fused op's weight (``fused``);
* ``weight="fold"``: the weight (viewed to ``[D]``, cast to the norm's dtype)
  is folded at AOT into a new constant (``folded_weight``);
* ``weight="unit"``: the norm is fused with a unit weight (ones, or None
  where the op's weight is optional and the policy's ``weightless`` is not
  ``"ones"``) and the multiply after it stays
  (``fused_unit_weight``): a runtime scale, a scalar, a weight not of shape
  ``[D]``, rounding between the norm and the weight, a weight the policy
  does not fold;
* ``weight="none"``: the norm has no weight at all (``fused``, with a unit
  weight as above), or ``rejected`` where the policy keeps weightless norms
  decomposed;
* ``outcome="rejected"``: nothing changes; ``reason`` says why.

``decide_fusions(found, fused_op, veto)`` is fusion's decision phase: one ``Decision`` per match of
the match phase, each then put to the backend's veto (``edgeplug._partition.delegation``). What the
later phases learn (a weight that could not be folded) changes a decision only through
``fold_failed`` here; ``Decision.record`` is what the report keeps of it.
"""

from __future__ import annotations

from dataclasses import dataclass
import dataclasses
from typing import Any, Callable, Literal, Optional, Union

import torch
from torch.fx import Node

from edgeplug._fusion.target import FusedOp
from edgeplug._fusion.rms_norm import RmsNormMatch
from edgeplug._fusion.nodes import dtype, dtype_name, is_qdq, shape
from edgeplug._records import FusionOutcome, FusionPolicy, FusionRecord

WeightAction = Literal["as_is", "fold", "unit", "none"]


@dataclass(frozen=True)
class Decision:
    """What becomes of one match."""

    match: RmsNormMatch
    outcome: FusionOutcome
    weight: Optional[WeightAction] = None
    reason: str = ""
    #: the fp32 upcast around the math goes inside the fused op (its kernel accumulates in fp32)
    absorb_upcast: bool = False

    @property
    def keeps_multiply(self) -> bool:
        """The multiply after the norm stays (the norm alone is fused)."""
        return self.weight == "unit"

    @property
    def input_dtype(self) -> Optional[torch.dtype]:
        """The fused op's input (and weight) dtype."""
        m = self.match
        return dtype(m.upcast.args[0] if self.absorb_upcast else m.input)

    def record(self, weight: Any = None) -> FusionRecord:
        """What the report keeps of this decision (``weight``: the fused op's weight node, once made)."""
        m = self.match
        return FusionRecord(
            pattern="rms_norm",
            anchor=m.anchor.name,
            outcome=self.outcome,
            reason=self.reason if self.outcome in ("fused_unit_weight", "rejected") else "",
            eps=m.eps if self.outcome != "rejected" else None,
            weight=weight.name if isinstance(weight, Node) else None,
        )

    @property
    def fold_key(self) -> tuple[Node, int, Optional[torch.dtype]]:
        """Matches with equal keys share one folded constant."""
        return (self.match.weight, self.match.dim, self.input_dtype)


#: ``veto(decision) -> reason`` ("" when the fusion may go ahead)
Veto = Callable[["Decision"], str]


def decide_fusions(
    found: list[Union[RmsNormMatch, FusionRecord]], fused: FusedOp, veto: Optional[Veto] = None
) -> list[Union[Decision, FusionRecord]]:
    """The decision phase: each match of ``found`` decided and put to ``veto``; its records kept as they are."""
    return [_decide_vetoed(m, fused, veto) if isinstance(m, RmsNormMatch) else m for m in found]


def _decide_vetoed(m: Any, fused: FusedOp, veto: Optional[Veto]) -> Decision:
    """``decide_fusion``, then the veto; an fp32 upcast the veto refuses inside the op stays outside instead."""
    d = decide_fusion(m, fused)
    why = veto(d) if veto is not None and d.outcome != "rejected" else ""
    if why and d.absorb_upcast:
        outside = decide_fusion(m, fused, absorb_upcast=False)
        if not veto(outside):
            return outside
    return Decision(m, "rejected", reason=why) if why else d


def decide_fusion(m: RmsNormMatch, fused: FusedOp, *, absorb_upcast: bool = True) -> Decision:
    """The decision for ``m`` under ``fused.policy``; see the module docstring.

    ``absorb_upcast=False`` keeps an fp32 upcast outside the fused op even
    where the policy's kernel accumulates in fp32 (it may take fp32 only).
    """
    p = fused.policy
    absorb = absorb_upcast and p.fp32_accumulation and m.upcast is not None and m.cast_back is not None
    d = Decision(m, "fused", "none", absorb_upcast=absorb)
    if m.scale_mul is not None:
        return _unit_weight(d, p, m.scale_reason, ": the norm is fused alone and the multiply stays")
    if m.weight is None:
        if p.weightless == "keep":
            reason = (
                f"the norm has no weight and the {p.backend} policy keeps such a norm decomposed "
                f"(its {p.target} reads a weight tensor)"
            )
            return Decision(m, "rejected", reason=reason)
        return d
    rounding = rounds_before_weight(m)
    if rounding:
        # quantize/dequantize (or a narrower cast) round and clamp the norm's output before
        # the multiply: folding the weight across them would change the result
        why = f"{rounding} between the norm and the weight multiply rounds the norm's output"
        return _unit_weight(d, p, why, "; it and the multiply stay", always=True)
    if m.weight_source in p.weight_sources and usable_as_is(m.weight, m.dim, d.input_dtype, p.dequantized_weights):
        return Decision(m, "fused", "as_is", absorb_upcast=absorb)
    why_not = _why_not_folded(m, p)
    if why_not is None:
        return Decision(m, "folded_weight", "fold", absorb_upcast=absorb)
    if not p.unit_weight_fallback:
        reason = (
            f"weight {m.weight.name!r} is {m.weight_source} ({why_not or 'not usable as it is'}) and the "
            f"{p.backend} policy neither folds it nor fuses with a unit weight"
        )
        return Decision(m, "rejected", reason=reason)
    runtime = f"weight {m.weight.name!r} is known only at runtime: its multiply stays after the norm"
    return _unit_weight(d, p, why_not or runtime, always=True)


def _unit_weight(d: Decision, p: FusionPolicy, why: str, then: str = "", always: bool = False) -> Decision:
    """Fused with a unit weight, the multiply kept (``why`` + ``then``); rejected where the policy allows none."""
    if not (always or p.unit_weight_fallback):
        reason = f"{why}, and the {p.backend} policy does not fuse with a unit weight"
        return Decision(d.match, "rejected", reason=reason)
    return Decision(d.match, "fused_unit_weight", "unit", why + then, d.absorb_upcast)


def _why_not_folded(m: RmsNormMatch, p: FusionPolicy) -> Optional[str]:
    """None if the weight can be folded under the policy; else why not ("" for a runtime weight)."""
    if m.weight_source == "runtime":
        return ""
    if m.weight_source == "leaf" and m.weight.op == "call_function":  # dequantize(constant)
        if p.dequantized_weights == "fold":
            return None
        return f"weight {m.weight.name!r} is a dequantized constant the fused op cannot take as it is; its multiply stays"
    if not p.fold_computed_constants:
        return f"weight {m.weight.name!r} is {m.weight_source}; the policy does not fold"
    return None


def usable_as_is(w: Node, dim: int, dt: Optional[torch.dtype], dequantized: str) -> bool:
    """The weight can be the fused op's weight as it is: shape [D], the norm's dtype, a constant.

    A dequantize of a constant counts where the backend reads static
    quantized weights (``dequantized == "keep"``); otherwise (a prepacked
    float weight) only a constant placeholder or attribute does.
    """
    if shape(w) != (dim,) or dtype(w) != dt:
        return False
    return w.op in ("placeholder", "get_attr") or dequantized == "keep"


def rounds_before_weight(m: RmsNormMatch) -> str:
    """The op between the norm and its weight multiply that loses precision, named ("" if none)."""
    final = dtype(m.output)
    for n in m.between:
        if is_qdq(n):
            return f"{n.name!r} (quantize/dequantize)"
        narrow = dtype(n)
        if final is not None and narrow is not None and torch.promote_types(narrow, final) != narrow:
            return f"{n.name!r} (a cast to {dtype_name(narrow)})"
    return ""


def fold_failed(d: Decision, error: Any, policy: FusionPolicy) -> Decision:
    """A weight that could not be folded: the norm is fused with a unit weight and the multiply STAYS."""
    why = f"weight {d.match.weight.name!r} could not be folded ({error or 'an earlier fold removed it'})"
    if not policy.unit_weight_fallback:
        reason = f"{why}, and the {policy.backend} policy does not fuse with a unit weight"
        return dataclasses.replace(d, outcome="rejected", weight=None, reason=reason)
    return dataclasses.replace(d, outcome="fused_unit_weight", weight="unit", reason=f"{why}: its multiply stays")


def shares_folded_weight(d: Decision) -> Decision:
    """A later norm sharing a weight an earlier one folded finds a constant of the program: fused as it is."""
    return dataclasses.replace(d, outcome="fused", weight="as_is")


def too_late(d: Decision, why: str) -> Decision:
    """Refused at rewrite: what the match covers is gone (``why``)."""
    return dataclasses.replace(d, outcome="rejected", reason=why)
