"""Constant folding: constant-only subgraphs evaluated at AOT into lifted constants.

At a program's static shapes, the attention mask, the positions and the
rotary tables of a decoder depend on no input, yet they are computed at run
time by ops a backend often does not delegate (``arange``, ``cumsum``,
``index.Tensor``, ``where`` ...). ``fold_constant_subgraphs`` runs them once,
here, and gives the program their results as ``CONSTANT_TENSOR`` inputs.

What is constant comes from ``analyze_constants`` (a node is constant-only
when everything it reads is a parameter, buffer, lifted constant or another
constant-only node; a value written in place and RNG ops break the chain).
Of those, a node is *foldable* unless:

- it reads a **parameter**, directly or through other nodes: weights stay
  what the backend sees (a linear weight's permute, a norm's ``1 + w``,
  which fusion folds under the backend's policy). Buffers (``inv_freq``) and
  lifted constants may be folded;
- it is a **quantize / dequantize / choose_qparams** op, or reads one: a
  quantized program keeps its q/dq pairs on weights;
- any value it depends on has a **symbolic size**: its ``meta["val"]`` (and
  those of the nodes it reads) must have concrete int shapes. A size taken
  from a dynamic input dimension is a node reading that input, which the
  analysis already excludes; a data-dependent size (``nonzero`` of a buffer,
  an unbacked symbol) is constant-only, and this check is what keeps it;

The foldable nodes that are folded are the *frontier*: a foldable node
whose value is needed at run time, because a user is not folded with it (a
node that reads a runtime value, one that is kept as it is below) or the
program returns it. The subgraph behind a folded node is removed where
nothing else reads it, together with constant placeholders left unused
(their input specs and their tensors in ``state_dict`` / ``constants``).
A frontier node is kept as it is, and the nodes it reads are considered for
the frontier in its place, when:

- it only **rearranges a leaf** (a view, or a copy that changes nothing, of a
  parameter, buffer or constant, through any number of such ops): there is
  nothing to compute, and folding would store the leaf a second time;
- its value is larger than the **budget** (``BackendSpec.constant_fold_budget``,
  bytes; 0 turns folding off): recorded (``outcome="refused"``) with its size;
- the folds made so far, with it, would add more than the program's **total
  budget** (``total_budget``; by default ``default_total_budget(ep)``: the
  program's own constant bytes x ``TOTAL_RELATIVE``, at least
  ``TOTAL_FLOOR`` and at most ``TOTAL_ABSOLUTE``): recorded
  (``outcome="refused"``) with the budget and how it was reached. Folds are
  admitted in graph order; one that reuses an identical constant costs
  nothing. Forty layers that each fold ``arange(512*512) * k`` would store
  40 MiB the runtime computes from nothing; under the total, the runtime
  computes them, as stock ExecuTorch's program does;
- **evaluating** it here fails, or gives another shape or dtype than the graph
  records: recorded (``outcome="refused"``) with the cause.

Values are computed by the program's own ops on CPU tensors, in the graph's
dtypes (bf16 stays bf16). Folds whose values are identical (dtype, shape and
bits: each layer of a decoder builds the same mask and rotary tables) share
one constant. Everything is evaluated before the program changes: a refusal
changes nothing. Each fold is one ``TransformRecord``
(``transform="constant_fold"``, ``kind="fold"``): the node, its op, the
nodes the fold removed (the folded node, what only it read, and placeholders
left unused; a node several folds shared counts for the last, a check such as
``_assert_tensor_metadata`` of a value that goes for the first), and the
constant's size in ``bytes_added`` (0 for a fold that reuses an identical
constant: its detail names the fold that made it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from edgeplug._graph.constants import (
    ConstantAnalysis,
    analyze_constants,
    ancestors,
    constant_placeholders,
    evaluate_constants,
    remove_dead,
    replace_with_constant,
)
from edgeplug._graph.copies import is_identity_copy
from edgeplug._graph.ops import aliases_first_arg, aten_overload, base_name, is_qdq, op_name
from edgeplug._graph.rewrite import replace_uses
from edgeplug._records import TransformRecord

TRANSFORM = "constant_fold"
#: the budget a backend gets unless it sets its own (BackendSpec's default)
DEFAULT_BUDGET = 1 << 20
#: the total a program's folds may add: its own constants' bytes times this ...
TOTAL_RELATIVE = 1.0
#: ... but at least this many bytes (a program with no weights still gets its masks folded) ...
TOTAL_FLOOR = 256 << 10
#: ... and never more than this
TOTAL_ABSOLUTE = 64 << 20


def program_constant_bytes(ep: ExportedProgram) -> int:
    """Bytes of the program's own parameters, buffers and lifted constants (each storage once)."""
    seen: set[int] = set()
    total = 0
    for t in [*ep.state_dict.values(), *ep.constants.values()]:
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def default_total_budget(ep: ExportedProgram) -> tuple[int, str]:
    """``(bytes, how)``: the most all of ``ep``'s folds together may add."""
    own = program_constant_bytes(ep)
    total = min(TOTAL_ABSOLUTE, max(TOTAL_FLOOR, int(own * TOTAL_RELATIVE)))
    return total, (
        f"{TOTAL_RELATIVE:g}x the program's own {own:,} constant bytes, at least {TOTAL_FLOOR:,}, "
        f"at most {TOTAL_ABSOLUTE:,}"
    )


@dataclass
class _Plan:
    """Which foldable nodes are folded, and which frontier nodes stay and why."""

    folds: list[torch.fx.Node] = field(default_factory=list)
    #: frontier nodes kept as they are -> why (a sentence), for the records
    kept: dict[torch.fx.Node, str] = field(default_factory=dict)
    #: checks (``_assert_tensor_metadata``) of values that are folded or die: erased with them
    checks: list[torch.fx.Node] = field(default_factory=list)


def fold_constant_subgraphs(
    ep: ExportedProgram, *, budget: int = DEFAULT_BUDGET, total_budget: Optional[int] = None
) -> list[TransformRecord]:
    """Fold ``ep``'s constant-only frontier in place (see the module docstring).

    Works on aten and edge dialect programs. ``budget`` is the largest
    constant (in bytes) one fold may create; 0 folds nothing.
    ``total_budget`` is the most all folds together may add (None: the
    default for ``ep``, ``default_total_budget``). Returns the records:
    folds, and frontier nodes left as they are because of a budget or a
    failed evaluation.
    """
    if budget < 0:
        raise ValueError(f"budget must be 0 (off) or a number of bytes, not {budget}")
    if total_budget is not None and total_budget < 0:
        raise ValueError(f"total_budget must be a number of bytes >= 0, not {total_budget}")
    if budget == 0:
        return []
    total, how = default_total_budget(ep) if total_budget is None else (total_budget, "given")
    analysis = analyze_constants(ep)
    foldable = _foldable_nodes(ep, analysis)
    if not foldable:
        return []
    refused: dict[torch.fx.Node, str] = {}
    while True:  # a refused fold puts what it reads on the frontier: plan again
        plan = _plan(ep, foldable, analysis, budget, refused)
        values = evaluate_constants(ep, plan.folds, analysis)
        failed = {n: f"not folded: {v}" for n, v in zip(plan.folds, values) if isinstance(v, ValueError)}
        if not failed:
            failed = _over_total(plan.folds, values, total, how)
        if not failed:
            break
        refused.update(failed)
    records = [_kept_record(n, why) for n, why in plan.kept.items()]
    records += _apply(ep, plan, values)
    return records


def _over_total(
    folds: list[torch.fx.Node], values: list[Any], total: int, how: str
) -> dict[torch.fx.Node, str]:
    """Folds (in graph order) that would take the bytes added past ``total``, with why."""
    made: list[torch.Tensor] = []
    added = 0
    over: dict[torch.fx.Node, str] = {}
    for node, value in zip(folds, values):
        if any(_identical(v, value) for v in made):
            continue  # shares a constant already made: adds nothing
        size = value.numel() * value.element_size()
        if added + size > total:
            over[node] = (
                f"not folded: its value ({_tensor_text(value)}, {size:,} bytes) would take the program's folded "
                f"constants to {added + size:,} bytes, over its total folding budget of {total:,} bytes ({how}); "
                "the runtime computes it instead"
            )
            continue
        made.append(value)
        added += size
    return over


# which nodes ---------------------------------------------------------------------


def _foldable_nodes(ep: ExportedProgram, analysis: ConstantAnalysis) -> set[torch.fx.Node]:
    """Constant-only ``call_function`` nodes that read no parameter, no q/dq op and no symbolic size."""
    parameters = {name for name, spec in constant_placeholders(ep).items() if spec.kind == InputKind.PARAMETER}
    blocked: set[torch.fx.Node] = set()
    out: set[torch.fx.Node] = set()
    for node in ep.graph_module.graph.nodes:
        if node not in analysis.constant_only:
            continue
        if node.op == "placeholder":
            if node.name in parameters:
                blocked.add(node)
            continue
        if node.op != "call_function":
            continue
        if is_qdq(node.target) or any(i in blocked for i in node.all_input_nodes):
            blocked.add(node)
        elif _static(node) or _is_check(node):
            out.add(node)
        else:
            blocked.add(node)
    return out


def _is_check(node: torch.fx.Node) -> bool:
    """``_assert_tensor_metadata``: a check of dtype and device that ``evaluate_constants`` makes too.

    (A check of values, ``_assert_async``, is no check: what it reads is folded and it stays.)
    """
    return base_name(node.target) == "_assert_tensor_metadata" and not node.users


def _static(node: torch.fx.Node) -> bool:
    """Every tensor in ``node``'s ``meta["val"]`` has a concrete shape (no SymInt)."""
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    if not any(isinstance(v, torch.Tensor) for v in vals):
        return False  # no recorded value: nothing to check the evaluation against
    return all(
        all(isinstance(d, int) for d in v.shape) for v in vals if isinstance(v, torch.Tensor)
    ) and all(v is None or isinstance(v, torch.Tensor) for v in vals)


def _plan(
    ep: ExportedProgram,
    foldable: set[torch.fx.Node],
    analysis: ConstantAnalysis,
    budget: int,
    refused: dict[torch.fx.Node, str],
) -> _Plan:
    """Walk the graph backwards: a foldable node is folded when a user needs its value at run time."""
    plan = _Plan()
    computed_at_aot: set[torch.fx.Node] = set()  # folded, or read only by what is
    checks = []
    for node in reversed(ep.graph_module.graph.nodes):
        if node not in foldable:
            continue
        if _is_check(node):  # it checks constants: it goes if what it reads goes
            checks.append(node)
            computed_at_aot.add(node)
            continue
        needed = any(u not in computed_at_aot for u in node.users)
        if not needed:
            if node.users:
                computed_at_aot.add(node)
            continue
        why = refused.get(node) or _why_kept(node, analysis, budget)
        if why is None:
            plan.folds.append(node)
            computed_at_aot.add(node)
        elif why:
            plan.kept[node] = why
    plan.folds.reverse()  # graph order
    plan.checks = [c for c in checks if all(_dies(i, computed_at_aot, plan) for i in c.all_input_nodes)]
    return plan


def _dies(node: torch.fx.Node, computed_at_aot: set[torch.fx.Node], plan: _Plan) -> bool:
    """Folded, or computed only for what is folded: nothing reads it once the folds are made."""
    return node in computed_at_aot and node not in plan.kept


def _why_kept(node: torch.fx.Node, analysis: ConstantAnalysis, budget: int) -> Optional[str]:
    """None: fold it. "": keep it, nothing to say. Else the record's detail."""
    if _rearranges_leaf(node, analysis):
        return ""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return ""  # a tuple (split, max.dim): its items are folded where they are read
    size = val.numel() * val.element_size()
    if size > budget:
        return (
            f"not folded: its value ({_tensor_text(val)}) is {size:,} bytes, over the backend's "
            f"constant_fold_budget of {budget:,} bytes"
        )
    return None


def _rearranges_leaf(node: torch.fx.Node, analysis: ConstantAnalysis) -> bool:
    """A view, or a copy that changes nothing, of a constant leaf (through any number of them)."""
    while node not in analysis.leaves:
        if node.op != "call_function" or not (_is_view(node) or is_identity_copy(node)):
            return False
        node = node.args[0]
    return True


def _is_view(node: torch.fx.Node) -> bool:
    """A view op (``view``, ``permute``, ...), or the ``*_copy`` form edge dialect writes it as."""
    if aliases_first_arg(node):
        return True
    name = base_name(node.target)
    if not name.endswith("_copy") or not isinstance(node.args[0] if node.args else None, torch.fx.Node):
        return False
    packet = getattr(torch.ops.aten, name[: -len("_copy")], None)
    overload = getattr(aten_overload(node.target), "_overloadname", "default") or "default"
    view = getattr(packet, overload, None) if packet is not None else None
    schema = getattr(view, "_schema", None)
    return bool(schema is not None and schema.returns and schema.returns[0].alias_info is not None)


# changing the program ------------------------------------------------------------


def _apply(ep: ExportedProgram, plan: _Plan, values: list[Any]) -> list[TransformRecord]:
    graph = ep.graph_module.graph
    before = len(graph.nodes)  # the first fold counts the checks
    for check in plan.checks:  # the folded values have the shapes and dtypes the graph records
        graph.erase_node(check)
    records = []
    made: list[tuple[torch.Tensor, torch.fx.Node, str]] = []  # (value, its placeholder, the node it replaced)
    for node, value in zip(plan.folds, values):
        name, op = node.name, op_name(node)
        same = next(((ph, first) for v, ph, first in made if _identical(v, value)), None)
        if same is None:
            made.append((value, replace_with_constant(ep, node, f"folded_{name}", value), name))
            size, detail = value.numel() * value.element_size(), f"{_tensor_text(value)} constant"
        else:  # each layer builds the same mask and rotary tables: one constant serves them all
            subgraph = ancestors(node)
            replace_uses(ep, node, same[0])
            remove_dead(ep, subgraph)
            size, detail = 0, f"{_tensor_text(value)} constant, the one folded from {same[1]} (same bits)"
        records.append(
            TransformRecord(
                transform=TRANSFORM,
                kind="fold",
                node=name,
                op=op,
                removed=before + (1 if same is None else 0) - len(graph.nodes),
                bytes_added=size,
                detail=detail,
            )
        )
        before = len(graph.nodes)
    if plan.folds or plan.checks:
        graph.lint()
        ep.graph_module.recompile()
    return records


def _identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bits (NaNs and signed zeros included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def _kept_record(node: torch.fx.Node, why: str) -> TransformRecord:
    return TransformRecord(
        transform=TRANSFORM, kind="fold", node=node.name, op=op_name(node), outcome="refused", removed=0, detail=why
    )


def _tensor_text(t: torch.Tensor) -> str:
    dtype = str(t.dtype).removeprefix("torch.")
    return f"{tuple(t.shape)} {dtype}"


__all__ = [
    "DEFAULT_BUDGET", "TOTAL_ABSOLUTE", "TOTAL_FLOOR", "TOTAL_RELATIVE", "TRANSFORM", "default_total_budget",
    "fold_constant_subgraphs", "program_constant_bytes",
]
