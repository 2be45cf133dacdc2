"""Fusion's fold phase: every weight the decisions fold (Gemma's ``1 + w``, a static view or cast, a
dequantized constant where the policy folds those) and every unit weight they need becomes a
constant of the program, in one ``edgeplug._graph.fold_constants`` call.

``fold_weights`` returns, for each decision, the decision as it stands after folding (a weight that
could not be folded makes it ``fused_unit_weight`` or ``rejected``: ``decision.fold_failed``) and
the node the fused op takes as its weight. A weight two norms share is folded once and read by both.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.fx import Node
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from edgeplug._fusion.decision import Decision, fold_failed, shares_folded_weight
from edgeplug._fusion.nodes import dtype, dtype_name, shape
from edgeplug._fusion.ops import GraphOps
from edgeplug._fusion.target import FusedOp
from edgeplug._graph import fold_constants



def fold_weights(
    ep: ExportedProgram, fused: FusedOp, ops: GraphOps, decisions: list[Decision]
) -> dict[int, tuple[Decision, Optional[Node]]]:
    """id(decision) -> (the decision after folding, the fused op's weight node) for every decision to rewrite."""
    return _WeightFolder(ep, fused, ops).fold(decisions)


class _WeightFolder:
    """Every weight the decisions fold, and every unit weight they need, made in one ``fold_constants`` call."""

    def __init__(self, ep: ExportedProgram, fused: FusedOp, ops: GraphOps) -> None:
        self.ep, self.fused, self.ops = ep, fused, ops
        self.graph = ep.graph_module.graph
        self.units: dict[tuple[int, Optional[torch.dtype], int], Node] = {}

    def fold(self, decisions: list[Decision]) -> dict[int, tuple[Decision, Optional[Node]]]:
        """id(decision) -> (the decision as it stands after folding, the fused op's weight node)."""
        batch: list[Node] = []
        hints: list[str] = []
        added: list[list[Node]] = []
        slot: dict[Any, int] = {}  # fold key or unit key -> index in the batch
        for d in decisions:
            key = self._key(d)
            if key is None or key in slot:
                continue
            slot[key] = len(batch)
            if d.weight == "fold":
                node, new = self._fold_target(d)
                hint = _weight_name(self.ep, d.match.weight)
            else:
                node, new, hint = self._unit_weight_node(*key[1:3]), [], _unit_name(*key[1:3])
            batch.append(node)
            hints.append(hint)
            added.append(new)
        dequantize = self.fused.policy.dequantized_weights == "fold"
        results = fold_constants(self.ep, batch, hints, errors="return", dequantize=dequantize) if batch else []
        for i, result in enumerate(results):
            if not isinstance(result, Node):
                for n in reversed(added[i]):
                    self.graph.erase_node(n)
        for key, i in slot.items():
            if key[0] == "unit" and isinstance(results[i], Node):
                self.units[key[1:]] = results[i]
        return self._settle(decisions, slot, results)

    def _settle(self, decisions: list[Decision], slot: dict, results: list[Any]) -> dict[int, tuple[Decision, Optional[Node]]]:
        out: dict[int, tuple[Decision, Optional[Node]]] = {}
        owners: set[int] = set()
        for d in decisions:
            key = self._key(d)
            if d.weight != "fold":
                out[id(d)] = (d, self.unit_weight(d) if key is not None else None)
                continue
            result = results[slot[key]]
            if isinstance(result, Node):
                first = slot[key] not in owners
                owners.add(slot[key])
                out[id(d)] = (d if first else shares_folded_weight(d), result)
                continue
            failed = fold_failed(d, result, self.fused.policy)
            out[id(d)] = (failed, self.unit_weight(failed) if failed.outcome != "rejected" else None)
        return out

    def _key(self, d: Decision) -> Optional[tuple]:
        if d.weight == "fold":
            return ("fold", *d.fold_key)
        if d.weight in ("unit", "none") and self.fused.unit_weight_is_ones:
            # one ones([D]) per fused norm, not one per (D, dtype): a constant two partitions read becomes a
            # runtime input of both, and a delegate that prepacks its norm weights cannot load it (ExecuTorch's
            # Vulkan runtime: "prepack_standard ... val_is_tref"); the .pte's named data stores equal bytes once
            return ("unit", d.match.dim, d.input_dtype, id(d))
        return None

    def unit_weight(self, d: Decision) -> Optional[Node]:
        """The constant ``ones([D])`` in the norm's dtype (None where the op takes None for no weight)."""
        if not self.fused.unit_weight_is_ones:
            return None
        key = (d.match.dim, d.input_dtype, id(d))
        if key not in self.units:  # only a failed fold needs one the batch did not make
            (self.units[key],) = fold_constants(self.ep, [self._unit_weight_node(*key[:2])], _unit_name(*key[:2]))
        return self.units[key]

    def _unit_weight_node(self, dim: int, dt: Optional[torch.dtype]) -> Node:
        first = next(n for n in self.graph.nodes if n.op != "placeholder")
        with self.graph.inserting_before(first):
            return self.ops.call(self.ops.full, ([dim], 1.0), {"dtype": dt}, like=None)

    def _fold_target(self, d: Decision) -> tuple[Node, list[Node]]:
        """The weight viewed to ``[D]`` and cast to the norm's dtype (by nodes added here, returned too)."""
        m, node, added = d.match, d.match.weight, []
        if shape(node) != (m.dim,):
            with self.graph.inserting_after(node):
                node = self.ops.call(self.ops.view, (node, [m.dim]), like=m.weight)
            added.append(node)
        if dtype(node) != d.input_dtype:
            with self.graph.inserting_after(node):
                node = self.ops.cast_to(node, d.input_dtype, like=m.weight)
            added.append(node)
        return node, added


def _weight_name(ep: ExportedProgram, w: Node) -> str:
    """``blocks.0.norm.weight_rms_norm``: named after the parameter the weight comes from."""
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs if s.target}
    found: list = []
    stack, seen = [w], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder" and n.name in specs:
            found.append(specs[n.name])
        stack.extend(n.all_input_nodes)
    found.sort(key=lambda spec: spec.kind != InputKind.PARAMETER)  # a parameter names it best
    return f"{found[0].target}_rms_norm" if found else f"{w.name}_rms_norm"


def _unit_name(dim: int, dt: Optional[torch.dtype]) -> str:
    return f"rms_norm_unit_weight_{dim}_{dtype_name(dt)}"


