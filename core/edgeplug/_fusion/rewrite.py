"""Fusion's rewrite phase: each decided match replaced by the policy's op (``policy.emits``, e.g.
``aten.rms_norm(input, normalized_shape, weight, eps)`` or ``et_vk.rms_norm(input, weight, eps)``),
eps always explicit; where the norm is fused with a unit weight, the multiply after it stays. What
only the replaced nodes computed goes. A node an earlier rewrite replaced is followed to what
replaced it. One ``FusionRecord`` per candidate, in the order the match phase found them.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from torch.fx import Node
from torch.export import ExportedProgram

from edgeplug._fusion.decision import Decision, too_late
from edgeplug._fusion.nodes import dtype
from edgeplug._fusion.ops import GraphOps, like
from edgeplug._fusion.target import FusedOp
from edgeplug._graph.constants import ancestors, remove_dead
from edgeplug._graph.rewrite import replace_uses
from edgeplug._records import FUSED_ANCHOR, FusionRecord



def rewrite_all(
    ep: ExportedProgram,
    fused: FusedOp,
    ops: GraphOps,
    items: list[Union[Decision, FusionRecord]],
    weights: dict[int, tuple[Decision, Optional[Node]]],
) -> list[FusionRecord]:
    """Rewrite every decision ``weights`` holds (as the fold phase left it); a record per item of ``items``."""
    rewriter = _Rewriter(ep, fused, ops)
    records = []
    for item in items:
        if isinstance(item, FusionRecord):
            records.append(item)
            continue
        decision, weight = weights.get(id(item), (item, None))
        records.append(rewriter.rewrite(decision, weight) if decision.outcome != "rejected" else decision.record())
    return records


class _Rewriter:
    """Replaces one decided match by the fused op (and what must stay after it)."""

    def __init__(self, ep: ExportedProgram, fused: FusedOp, ops: GraphOps) -> None:
        self.ep, self.fused, self.ops = ep, fused, ops
        self.graph = ep.graph_module.graph
        self.replaced: dict[Node, Node] = {}

    def live(self, node: Any) -> Any:
        """``node``, or what an earlier rewrite replaced it by."""
        while node in self.replaced:
            node = self.replaced[node]
        return node

    def rewrite(self, d: Decision, weight: Optional[Node]) -> FusionRecord:
        m = d.match
        if any(getattr(n, "_erased", False) for n in m.nodes):
            why = "the norm computes a constant another norm's folded weight took in (nothing is left to fuse)"
            return too_late(d, why).record()
        x = self.live(m.upcast.args[0] if d.absorb_upcast else m.input)
        norm_only = d.keeps_multiply or m.weight is None
        replaced = (m.cast_back if d.absorb_upcast else m.anchor) if norm_only else m.output
        if d.weight == "as_is" and weight is None:
            weight = self.live(m.weight)
        with self.graph.inserting_before(replaced):
            args = self.fused.args(input=x, dim=m.dim, weight=weight, eps=m.eps)
            # the fused op's output is its input's shape and dtype (computed from metadata: its
            # composite implementation cannot run on dynamic-shaped fake tensors)
            out = self.ops.call(self.fused.op, args, like=m.anchor, val=like(x))
            out.meta["custom"] = {**out.meta.get("custom", {}), FUSED_ANCHOR: m.anchor.name}
            if d.keeps_multiply and m.weight_in_op:
                out = self.ops.call(self.ops.mul, (out, self.live(m.weight)), like=m.anchor)
            if dtype(out) != dtype(replaced):
                out = self.ops.cast_to(out, dtype(replaced), like=m.anchor)
        replace_uses(self.ep, replaced, out)
        self.replaced[replaced] = out
        dead = set(m.nodes)
        dead |= {a for n in dead for a in n.all_input_nodes}
        if m.weight is not None and not d.keeps_multiply:
            # what only computed a weight that was folded (1 + w, its casts, w itself) goes too
            dead.update(ancestors(m.weight))
        remove_dead(self.ep, dead)
        return d.record(weight)


