"""Applying decisions to a program: every weight folded in one batch, then the rewrites.

``fuse_matches(ep, fused_op)`` works in place on ``ep`` (the caller passes a
copy): it matches every node against one constant analysis, decides each
match (``edgeplug._fusion.decision``), folds what the decisions fold with one
``fold_constants`` call, and rewrites each match into the fused op. Nothing
is matched twice: a weight two norms share is folded once and read by both;
a node an earlier rewrite replaced is followed to what replaced it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Union

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from edgeplug._fusion.decision import Decision, decide_fusion
from edgeplug._fusion.delegation import Veto
from edgeplug._policy_target import FusedOp
from edgeplug._graph import analyze_constants, fold_constants, reserve_node_names
from edgeplug._graph.constants import ancestors, remove_dead
from edgeplug._graph.ops import edge_ops
from edgeplug._graph.rewrite import copy_meta, fake_mode_of, replace_uses
from edgeplug._patterns import inverse_rms_of_mean, match_rms_norm
from edgeplug._patterns.base import describe, dtype, dtype_name, shape
from edgeplug._records import FUSED_ANCHOR, FusionPolicy, FusionRecord

Node = torch.fx.Node


def fuse_matches(ep: ExportedProgram, fused: FusedOp, veto: Optional[Veto] = None) -> list[FusionRecord]:
    """Fuse every RMSNorm of ``ep`` in place; one record per candidate (matches in graph order, then
    the norms nothing matched)."""
    reserve_node_names(ep.graph_module)
    items = decide_fusions(ep, fused, veto)
    ops = _GraphOps(ep)
    todo = [d for d in items if isinstance(d, Decision) and d.outcome != "rejected"]
    weights = _WeightFolder(ep, fused, ops).fold(todo)
    rewriter = _Rewriter(ep, fused, ops)
    records = []
    for item in items:
        if isinstance(item, FusionRecord):
            records.append(item)
        elif item.outcome == "rejected":
            records.append(_record(item))
        else:
            decision, weight = weights[id(item)]
            records.append(rewriter.rewrite(decision, weight) if decision.outcome != "rejected" else _record(decision))
    return records


def decide_fusions(ep: ExportedProgram, fused: FusedOp, veto: Optional[Veto] = None) -> list[Union[Decision, FusionRecord]]:
    """A decision for every match, a rejection record for every refused candidate (changes nothing)."""
    analysis = analyze_constants(ep)
    items: list[Union[Decision, FusionRecord]] = []
    accounted: set[Node] = set()
    for node in ep.graph_module.graph.nodes:
        m = match_rms_norm(node, ep, analysis=analysis)
        if m:
            items.append(_decide_vetoed(m, fused, veto))
            accounted.update(m.nodes)
        elif m.candidate:
            items.append(FusionRecord(pattern="rms_norm", anchor=node.name, outcome="rejected", reason=m.reason))
            accounted.add(node)
    return items + _unaccounted_norms(ep, accounted)


def _decide_vetoed(m: Any, fused: FusedOp, veto: Optional[Veto]) -> Decision:
    """``decide_fusion``, then the veto; an fp32 upcast the veto refuses inside the op stays outside instead."""
    d = decide_fusion(m, fused)
    why = veto(d) if veto is not None and d.outcome != "rejected" else ""
    if why and d.absorb_upcast:
        outside = decide_fusion(m, fused, absorb_upcast=False)
        if not veto(outside):
            return outside
    return Decision(m, "rejected", reason=why) if why else d


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


def _record(d: Decision, weight: Any = None) -> FusionRecord:
    m = d.match
    return FusionRecord(
        pattern="rms_norm",
        anchor=m.anchor.name,
        outcome=d.outcome,
        reason=d.reason if d.outcome in ("fused_unit_weight", "rejected") else "",
        eps=m.eps if d.outcome != "rejected" else None,
        weight=weight.name if isinstance(weight, Node) else None,
    )


class _GraphOps:
    """The helper ops fusion creates, in the program's dialect, and how to make a node."""

    def __init__(self, ep: ExportedProgram) -> None:
        self.graph = ep.graph_module.graph
        self.edge = ep.dialect == "EDGE"
        if self.edge:
            ns: Any = edge_ops()
        else:
            ns = torch.ops
        self.mul = ns.aten.mul.Tensor
        self.view = ns.aten.view_copy.default
        self.full = ns.aten.full.default
        self.cast = ns.dim_order_ops._to_dim_order_copy.default if self.edge else ns.aten._to_copy.default
        self.fake_mode = fake_mode_of(self.graph)

    def cast_to(self, node: Node, to: Optional[torch.dtype], like: Optional[Node]) -> Node:
        kwargs: dict[str, Any] = {"dtype": to}
        if self.edge:
            kwargs["dim_order"] = list(range(len(shape(node) or ())))
        return self.call(self.cast, (node,), kwargs, like=like)

    def call(self, target: Any, args: tuple, kwargs: Optional[dict] = None, *, like: Optional[Node], val: Any = None) -> Node:
        kwargs = kwargs or {}
        node = self.graph.call_function(target, args, kwargs)
        node.meta["val"] = val if val is not None else _fake_eval(target, args, kwargs, self.fake_mode)
        copy_meta(like, node)
        return node


class _WeightFolder:
    """Every weight the decisions fold, and every unit weight they need, made in one ``fold_constants`` call."""

    def __init__(self, ep: ExportedProgram, fused: FusedOp, ops: _GraphOps) -> None:
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
                # a later norm sharing the weight finds a constant of the program: fused as it is
                out[id(d)] = (d if first else dataclasses.replace(d, outcome="fused", weight="as_is"), result)
                continue
            failed = _fold_failed(d, result, self.fused.policy)
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


def _fold_failed(d: Decision, error: Any, policy: FusionPolicy) -> Decision:
    """A weight that could not be folded: the norm is fused with a unit weight and the multiply STAYS."""
    why = f"weight {d.match.weight.name!r} could not be folded ({error or 'an earlier fold removed it'})"
    if not policy.unit_weight_fallback:
        reason = f"{why}, and the {policy.backend} policy does not fuse with a unit weight"
        return dataclasses.replace(d, outcome="rejected", weight=None, reason=reason)
    return dataclasses.replace(d, outcome="fused_unit_weight", weight="unit", reason=f"{why}: its multiply stays")


class _Rewriter:
    """Replaces one decided match by the fused op (and what must stay after it)."""

    def __init__(self, ep: ExportedProgram, fused: FusedOp, ops: _GraphOps) -> None:
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
            return _record(dataclasses.replace(d, outcome="rejected", reason=why))
        x = self.live(m.upcast.args[0] if d.absorb_upcast else m.input)
        norm_only = d.keeps_multiply or m.weight is None
        replaced = (m.cast_back if d.absorb_upcast else m.anchor) if norm_only else m.output
        if d.weight == "as_is" and weight is None:
            weight = self.live(m.weight)
        with self.graph.inserting_before(replaced):
            args = self.fused.args(input=x, dim=m.dim, weight=weight, eps=m.eps)
            # the fused op's output is its input's shape and dtype (computed from metadata: its
            # composite implementation cannot run on dynamic-shaped fake tensors)
            out = self.ops.call(self.fused.op, args, like=m.anchor, val=_like(x))
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
        return _record(d, weight)


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


def _fake_eval(target: Any, args: tuple, kwargs: dict, mode: Any) -> Any:
    """The output metadata of ``target(*args)``, computed on the inputs' fake tensors."""

    def meta(a: Any) -> Any:
        return a.meta.get("val") if isinstance(a, Node) else a

    with mode:
        return target(*torch.fx.node.map_aggregate(args, meta), **torch.fx.node.map_aggregate(kwargs, meta))


def _like(node: Node) -> Any:
    """A fake tensor of ``node``'s shape, dtype and device (contiguous)."""
    v = node.meta["val"]
    with v.fake_mode:
        return torch.empty_like(v, memory_format=torch.contiguous_format)
