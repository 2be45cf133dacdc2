"""Partitioning as named phases, each a function of what it is given.

In the order ``CorePartitioner`` runs them on the edge graph:

1. ``inner_support``: what the backend's executorch partitioner tagged (the
   nodes it supports, grouped as it grouped them).
2. ``rules_verdict`` over those nodes (``accept``): the plugins' filters,
   then the constant-only rule, may refuse a node the partitioner took.
3. ``form_partitions``: the core forms the partitions from the accepted
   nodes with torch's capability-based partitioner, never joining what the
   partitioner kept apart, so a refusal cannot leave a dependency cycle or an
   invalid partition; ``drop_constant_only`` and ``tag_constants`` finish the
   tags.
4. ``cpu_reasons``: a reason for every node left on the CPU.
5. ``stranded_nodes``: kept-whole ops and fused ops left on the CPU (they
   have no CPU kernel, or were kept for the backend only).

Before decomposition the same rules (behind the backend's support check:
together, the one predicate ``CorePartitioner.delegable``) decide which
kept-whole ops stay whole (``keep_whole_decisions``, a frozen
``KeepWholeDecisions``). ``partition_graph`` runs the phases; its result is a
frozen ``PartitionOutcome``.
"""

from __future__ import annotations

import functools
import inspect
import operator
import os
import traceback
from collections import Counter
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import torch
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from edgeplug import _executorch
from edgeplug._errors import EdgeplugError
from edgeplug._graph.constants import constant_placeholders, constant_value, lift_constant, mutated_targets, remove_dead
from edgeplug._graph.ops import aten_overload, is_qdq, op_name
from edgeplug._records import FUSED_ANCHOR
from edgeplug._partition.verdict import TAKEN, FilterContext, NotAnAnswer, Verdict, filter_answer

#: node -> Verdict, with everything else it needs already bound
NodeCheck = Callable[[torch.fx.Node], Verdict]


def is_op_node(node: torch.fx.Node) -> bool:
    """A computation: a call other than the ``getitem`` that unpacks a tuple."""
    return node.op == "call_function" and node.target is not operator.getitem


# -- the outcome ------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionRecord:
    """One partition: its tag, the delegate it goes to, its nodes and op counts."""

    tag: str
    backend_id: str
    nodes: tuple[str, ...] = ()
    ops: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class StrandedNode:
    """An op that must not run on the CPU left there: a kept-whole op (neither
    delegated nor decomposed) or an op a fusion created for the backend."""

    node: str
    op: str
    reason: str

    def describe(self) -> str:
        return f"node {self.node!r} ({self.op}): {self.reason}"


@dataclass(frozen=True)
class PartitionOutcome:
    """What partitioning decided for one program.

    ``tags``: node name -> partition tag (what is, or in a dry run would be,
    delegated); ``partitions`` per tag; ``cpu_reasons``: node name -> why it
    stays on the CPU; ``refused``: the nodes the partitioner took that the
    filters or the constant-only rule refused, with the reason; ``stranded``:
    ops left on the CPU that cannot run there (empty when lowering is sound).
    """

    tags: Mapping[str, str]
    partitions: tuple[PartitionRecord, ...]
    cpu_reasons: Mapping[str, str]
    refused: Mapping[str, str]
    stranded: tuple[StrandedNode, ...]


@dataclass(frozen=True)
class KeepWholeDecisions:
    """What was decided before decomposition, for one aten program.

    ``ops``: every op kept whole for the backend (its records, then its
    partitioner's own); ``verdicts``: node name -> whether that node was
    kept whole, for each node of such an op; ``decomposed``: the nodes the
    backend refused, so decomposed instead: node -> (op, why); ``undone_fusions``:
    of those, the ones a fusion made: the fusion's anchor -> why.
    """

    ops: tuple[Any, ...]
    verdicts: Mapping[str, Verdict]
    decomposed: Mapping[str, tuple[str, str]]
    undone_fusions: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


# -- 2. the rules: filters, then the constant-only rule ----------------------------


def _filter_defined_at(fn: Any) -> str:
    """' (FILE:LINE)' where a filter function is defined, or '' when Python cannot tell."""
    try:
        target = inspect.unwrap(fn)
        code = getattr(target, "__code__", None) or getattr(getattr(target, "__call__", None), "__code__", None)  # noqa: B004 (a callable object's method)
        return f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
    except Exception:  # a builtin or an odd callable: the filter's name still says which
        return ""


def filter_verdict(filters: Sequence[Any], node: torch.fx.Node, ctx: FilterContext, origin: Callable[[Any], Any]) -> Optional[Verdict]:
    """The filters' combined answer: refused if any refuses, taken if any accepts, else None.

    A filter that raises, or answers anything but None/True/False/a Verdict,
    stops the lowering with an ``EdgeplugError`` naming the filter, its
    plugin, the node and what it returned.
    """
    accepted: Optional[Verdict] = None
    for f in filters:
        raised: Optional[BaseException] = None
        before = _shape_of(node)
        try:
            raw = f.fn(node, ctx)
        except Exception as exc:
            raised = exc
        try:
            if raised is None and _shape_of(node) != before:
                raise NotAnAnswer(
                    "changed the program while answering (the node's op, arguments or the graph's node count); "
                    "a filter only reads: the program it is handed is the lowering's, and a change there would "
                    "be delegated unchecked. Do the change in a pass (edgeplug_passes) instead"
                )
            answer = None if raised is not None else filter_answer(raw, f.name)
        except NotAnAnswer as exc:
            raised = exc
        if raised is not None:
            info = origin(f)
            who = f"plugin {info.name!r} ({info.distribution})" if info else "a plugin"
            what = str(raised) if isinstance(raised, NotAnAnswer) else f"raised {type(raised).__name__}: {raised}{_raised_at(raised, f.fn)}"
            raise EdgeplugError(
                f"partitioner filter {f.name!r}{_filter_defined_at(f.fn)} of backend {ctx.backend!r} from {who}, "
                f"on node {node.name!r} ({op_name(node.target)}) at stage {ctx.stage!r}: {what}. "
                "Fix the filter or disable the plugin; nothing was written"
            ) from raised
        if answer is not None and not answer:
            return answer
        accepted = accepted or answer
    return accepted


def _shape_of(node: torch.fx.Node) -> tuple:
    """What a filter must leave as it was: the node's op, inputs and name, and how many nodes its graph has."""
    return (node.name, node.op, node.target, node.args, node.kwargs, len(node.graph.nodes))


def graph_fingerprint(gm: torch.fx.GraphModule) -> list[tuple]:
    """Every node's name, op, target and inputs (by name): equal before and after the filters ran."""
    return [(n.name, n.op, str(n.target), str(n.args), str(n.kwargs)) for n in gm.graph.nodes]


def _raised_at(exc: BaseException, fn: Any) -> str:
    """' at FILE:LINE': the innermost frame in the filter's own folder (its plugin), else the innermost."""
    frames = traceback.extract_tb(exc.__traceback__)
    code = getattr(getattr(fn, "__wrapped__", fn), "__code__", None)
    home = os.path.dirname(code.co_filename) if code is not None else None
    own = [f for f in frames if home and os.path.dirname(f.filename) == home] or frames
    return f" at {own[-1].filename}:{own[-1].lineno}" if own else ""


def rules_verdict(
    node: torch.fx.Node, ctx: FilterContext, filters: Sequence[Any], *, constant_only_policy: bool, origin: Callable[[Any], Any]
) -> Verdict:
    """The core's rules on a node the backend supports: the plugins' filters, then the constant-only rule."""
    verdict = filter_verdict(filters, node, ctx, origin)
    constant_only = constant_only_policy and ctx.is_constant_only(node)
    because = (
        f"constant-only: reads no runtime input ({ctx.backend} refuses graphs "
        "without one, so it runs on the CPU)"
    )
    if verdict is not None and not verdict:
        return Verdict(False, f"{because}; {verdict.reason}") if constant_only else verdict
    if constant_only:
        if verdict is None:
            return Verdict(False, because)
        if ctx.stage == "partition" and any(ctx.is_constant_only(u) for u in node.users):
            # an accepted constant-only node (a weight dequantize) travels with
            # its consumers; one that also feeds constant-only CPU ops stays there
            return Verdict(False, "constant-only, and feeds constant-only ops that run on the CPU")
    return TAKEN


def keep_whole_decisions(gm: torch.fx.GraphModule, ops: Sequence[Any], delegable: NodeCheck) -> KeepWholeDecisions:
    """Keep a node whole iff it is a kept-whole op the backend will take (``delegable``); else it is decomposed."""
    keep = frozenset(aten_overload(op) for op in ops)
    verdicts: dict[str, Verdict] = {}
    decomposed: dict[str, tuple[str, str]] = {}
    undone: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or aten_overload(node.target) not in keep:
            continue
        v = verdicts[node.name] = delegable(node)
        if not v.ok:
            decomposed[node.name] = (op_name(node.target), v.reason)
            anchor = (node.meta.get("custom") or {}).get(FUSED_ANCHOR)
            if anchor is not None:
                undone[anchor] = v.reason
    return KeepWholeDecisions(
        tuple(ops), MappingProxyType(verdicts), MappingProxyType(decomposed), MappingProxyType(undone)
    )


@functools.lru_cache(maxsize=64)
def _decomposable(ops: tuple[Any, ...]) -> frozenset:
    table = _executorch.default_decompositions()
    return frozenset(aten_overload(op) for op in ops if op in table)


def decomposable(ops: Sequence[Any]) -> frozenset:
    """The kept-whole ops ``to_edge`` would otherwise decompose (keeping them was a choice), as aten overloads."""
    return _decomposable(tuple(ops))


def as_to_edge_decomposes(ep: Any, keep: Sequence[Any]) -> Any:
    """``ep`` as ``to_edge`` decomposes it with ``keep`` kept whole, where that makes new nodes of a kept op.

    The keep-whole decision is asked of the aten program, but a kept op can first appear when ``to_edge``
    decomposes another op (an LSTM becomes ``aten.linear`` nodes): such a node was never judged, so it is
    kept whole whatever the rules would say of it, and a rule that reads the graph around it (a constant-only
    one: the LSTM's first step multiplies a zero initial state by a weight) refuses it at partitioning, where
    it is stranded. Judging the decomposed program instead gives every such node its verdict. The program is
    decomposed only where it holds an op ``to_edge`` would decompose (else ``ep`` is returned); node names
    come out as ``to_edge``'s own decomposition with the same table makes them.
    """
    table = _executorch.default_decompositions()
    kept = set(keep)
    if not kept:
        return ep
    present = {n.target for n in ep.graph_module.graph.nodes if n.op == "call_function"}
    if not any(t in table and t not in kept for t in present):
        return ep
    return ep.run_decompositions({op: fn for op, fn in table.items() if op not in kept})


# -- 1. support: what the executorch partitioner tagged ------------------------------


def inner_support(gm: torch.fx.GraphModule) -> tuple[dict[torch.fx.Node, str], dict[torch.fx.Node, str]]:
    """(call node -> tag, constant node -> tag) as the backend's partitioner left them."""
    calls: dict[torch.fx.Node, str] = {}
    constants: dict[torch.fx.Node, str] = {}
    for node in gm.graph.nodes:
        tag = node.meta.get("delegation_tag")
        if tag is None:
            continue
        if node.op == "call_function":
            calls[node] = tag
        elif node.op in ("placeholder", "get_attr"):  # constants (and submodules) given to a delegate
            constants[node] = tag
    return calls, constants


def accept(supported: Iterable[torch.fx.Node], rules: NodeCheck) -> tuple[set[torch.fx.Node], dict[str, str]]:
    """(accepted nodes, node name -> reason refused). A getitem goes with the op it unpacks."""
    accepted: set[torch.fx.Node] = set()
    refused: dict[str, str] = {}
    getitems = []
    for node in supported:
        if not is_op_node(node):
            getitems.append(node)
            continue
        v = rules(node)
        if v:
            accepted.add(node)
        else:
            refused[node.name] = v.reason
    accepted.update(g for g in getitems if g.args and g.args[0] in accepted)
    return accepted, refused


# -- 3. tags ------------------------------------------------------------------------------


class _Accepted(OperatorSupportBase):
    def __init__(self, nodes: set[torch.fx.Node]) -> None:
        self.nodes = nodes

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        return node in self.nodes


def form_partitions(gm: torch.fx.GraphModule, inner: Mapping[torch.fx.Node, str], accepted: set[torch.fx.Node]) -> dict[torch.fx.Node, str]:
    """Node -> tag over the accepted nodes, as valid partitions.

    When the partitioner's groups are accepted whole they are kept as they
    are. Otherwise the accepted nodes are partitioned afresh (capability-based:
    no partition depends on itself through the CPU), and each new partition
    is cut along the partitioner's groups, which stays acyclic: a piece is the
    intersection of two convex sets. A group cut in pieces tags them
    ``<tag>_0``, ``<tag>_1``, ...
    """
    if all(n in accepted for n in inner):
        return dict(inner)

    proposed = CapabilityBasedPartitioner(gm, _Accepted(accepted), allows_single_node_partition=True).propose_partitions()
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    pieces: dict[tuple[int, str], list[torch.fx.Node]] = {}
    for p in proposed:
        for node in p.nodes:
            pieces.setdefault((p.id, inner[node]), []).append(node)
    by_tag: dict[str, list[list[torch.fx.Node]]] = {}
    for (_, tag), nodes in sorted(pieces.items(), key=lambda kv: min(order[n] for n in kv[1])):
        by_tag.setdefault(tag, []).append(nodes)
    out: dict[torch.fx.Node, str] = {}
    for tag, groups in by_tag.items():
        for i, nodes in enumerate(groups):
            out.update(dict.fromkeys(nodes, tag if len(groups) == 1 else f"{tag}_{i}"))
    return out


def drop_constant_only(tags: Mapping[torch.fx.Node, str], ctx: FilterContext) -> tuple[dict[torch.fx.Node, str], dict[str, str]]:
    """Untag every partition that reads no runtime input (the backend refuses such partitions)."""
    members: dict[str, list[torch.fx.Node]] = {}
    for node, tag in tags.items():
        if is_op_node(node):
            members.setdefault(tag, []).append(node)
    dropped = {t for t, nodes in members.items() if all(ctx.is_constant_only(n) for n in nodes)}
    why = f"its partition reads no runtime input ({ctx.backend} refuses such partitions)"
    reasons = {n.name: why for t in dropped for n in members[t]}
    return {n: t for n, t in tags.items() if t not in dropped}, reasons


def buffer_writes(gm: torch.fx.GraphModule, ep: Optional[Any]) -> dict[torch.fx.Node, Optional[torch.fx.Node]]:
    """Mutated buffer placeholder -> the node whose value the program writes back into it (``None``: not found)."""
    if ep is None or not hasattr(ep, "graph_signature"):
        return {}

    sig = ep.graph_signature
    written = {spec.target: spec.arg.name for spec in sig.output_specs if spec.kind == OutputKind.BUFFER_MUTATION}
    nodes = {n.name: n for n in gm.graph.nodes}
    out: dict[torch.fx.Node, Optional[torch.fx.Node]] = {}
    for spec in sig.input_specs:
        if spec.kind == InputKind.BUFFER and spec.target in written and spec.arg.name in nodes:
            out[nodes[spec.arg.name]] = nodes.get(written[spec.target])
    return out


def tag_constants(
    constants: Mapping[torch.fx.Node, str],
    tags: Mapping[torch.fx.Node, str],
    writes: Mapping[torch.fx.Node, Optional[torch.fx.Node]] = MappingProxyType({}),
    *,
    delegate_buffers: bool = True,
) -> dict[torch.fx.Node, str]:
    """A constant the partitioner gave a delegate stays with it while every user is in one partition.

    A mutated buffer (``writes``: placeholder -> the node whose value is written back) stays with a
    delegate only if that partition also computes the value written back: executorch moves a tagged
    buffer into its delegate, so a write from elsewhere (another partition, the CPU) would name a buffer
    the program no longer has ("Buffer output ... does not point to a buffer that exists"). Otherwise
    the buffer stays a program input the delegate reads. ``delegate_buffers=False``
    (``BackendSpec.delegate_buffers``): no mutated buffer goes to a delegate at all.
    """
    out: dict[torch.fx.Node, str] = {}
    for node in constants:
        users = {tags.get(u) for u in node.users}
        if len(users) == 1 and None not in users:
            tag = users.pop()
            if node in writes and (not delegate_buffers or writes[node] is None or tags.get(writes[node]) != tag):
                continue
            out[node] = tag
    return out


def copy_shared_constants(ep: Any, tags: Mapping[torch.fx.Node, str]) -> tuple[dict[torch.fx.Node, str], dict[str, tuple[str, ...]]]:
    """Give each partition its own copy of a constant that several partitions (or one and the CPU) read.

    ``tag_constants`` leaves a constant read by more than one partition (a tied
    embedding table and ``lm_head``), or by a partition and the CPU, in the program, an input every delegate call
    is handed at run time. For a runtime that builds an op's weight from
    constant data only (ExecuTorch's Vulkan runtime: an embedding, a
    convolution, a norm's weight) such a program does not load; with
    ``BackendSpec.copy_shared_constants`` each partition gets a
    ``CONSTANT_TENSOR`` of the same tensor (its storage is shared here; a
    delegate that keys constants by content, as Vulkan's and XNNPACK's named
    data do, stores it once). Users on the CPU keep the original. Changes
    ``ep`` in place; returns (node -> tag with the copies, constant -> the
    partitions given a copy).
    """
    specs = constant_placeholders(ep)
    mutated = mutated_targets(ep)
    out = dict(tags)
    copied: dict[str, tuple[str, ...]] = {}
    for node in list(ep.graph_module.graph.nodes):
        if node.op != "placeholder" or node.name not in specs or node in tags or specs[node.name].target in mutated:
            continue
        by_tag: dict[str, list[torch.fx.Node]] = {}
        for user in node.users:
            if user in tags:
                by_tag.setdefault(tags[user], []).append(user)
        on_cpu = sum(map(len, by_tag.values())) < len(node.users)
        value = constant_value(ep, node) if len(by_tag) > 1 or (by_tag and on_cpu) else None
        if value is None:
            continue
        for tag, users in by_tag.items():
            copy = lift_constant(ep, value, f"{specs[node.name].target}_{tag}".replace(".", "_"), like=node)
            for user in users:
                user.replace_input_with(node, copy)
            out[copy] = tag
        copied[node.name] = tuple(by_tag)
        remove_dead(ep, [node])  # read by delegates only: the copies replace it
    ep.graph_module.recompile()
    return {n: out[n] for n in ep.graph_module.graph.nodes if n in out}, copied


# -- 4. CPU reasons ---------------------------------------------------------------------


def cpu_reasons(
    gm: torch.fx.GraphModule,
    tags: Mapping[torch.fx.Node, str],
    known: Mapping[str, str],
    logged: Mapping[str, str],
    explain: NodeCheck,
) -> dict[str, str]:
    """A reason for every op node left on the CPU.

    ``known`` (refusals already decided) first, then what the partitioner
    itself logged, then ``explain(node)``.
    """
    out: dict[str, str] = {}
    for node in gm.graph.nodes:
        if not is_op_node(node) or node in tags:
            continue
        reason = known.get(node.name) or logged.get(node.name)
        out[node.name] = reason if reason else explain(node).reason
    return out


# -- 5. the stranded check ---------------------------------------------------------------


def stranded_nodes(
    gm: torch.fx.GraphModule,
    tags: Mapping[torch.fx.Node, str],
    reasons: Mapping[str, str],
    kept_whole: frozenset,
    fused: Mapping[str, str],
) -> tuple[StrandedNode, ...]:
    """Ops left on the CPU that cannot stay there.

    ``kept_whole``: kept-whole ops ``to_edge`` would otherwise decompose
    (quantize/dequantize excepted: they run on the CPU's quantized kernels).
    ``fused``: op name prefix ("et_vk.rms_norm") -> the fusion pattern that
    creates it for this backend; such an op exists only to be delegated.
    """
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node in tags:
            continue
        name = op_name(node.target)
        why = reasons.get(node.name, "?")
        if aten_overload(node.target) in kept_whole and not is_qdq(node.target):
            out.append(StrandedNode(node.name, name, f"kept whole before decomposition, but not delegated: {why}"))
            continue
        pattern = next((p for prefix, p in fused.items() if name == prefix or name.startswith(prefix + ".")), None)
        if pattern is not None:
            out.append(StrandedNode(node.name, name, f"created by the core's {pattern} fusion for this backend, but not delegated: {why}"))
    return tuple(out)


def partition_records(tags: Mapping[torch.fx.Node, str], backend_ids: Mapping[str, str]) -> tuple[PartitionRecord, ...]:
    """One record per tag, its op nodes in graph order."""
    nodes: dict[str, list[str]] = {}
    ops: dict[str, Counter] = {}
    for node, tag in tags.items():
        if is_op_node(node):
            nodes.setdefault(tag, []).append(node.name)
            ops.setdefault(tag, Counter())[op_name(node.target)] += 1
    return tuple(
        PartitionRecord(tag, backend_ids.get(tag, "?"), tuple(nodes[tag]), MappingProxyType(dict(ops[tag])))
        for tag in nodes
    )


# -- all of them --------------------------------------------------------------------------


def partition_graph(
    gm: torch.fx.GraphModule,
    ctx: FilterContext,
    *,
    rules: NodeCheck,
    explain: NodeCheck,
    logged: Mapping[str, str],
    inner_specs: Mapping[str, Any],
    constant_only_policy: bool,
    kept_whole: frozenset,
    fused: Mapping[str, str],
    delegate_buffers: bool = True,
) -> tuple[PartitionOutcome, dict[torch.fx.Node, str], dict[str, Any]]:
    """The phases in order, on a graph the backend's partitioner tagged.

    Returns the outcome, node -> tag (graph order) and tag -> the
    partitioner's delegation spec for it. Reads the graph; changes nothing.
    """
    calls, constants = inner_support(gm)
    before = graph_fingerprint(gm)
    accepted, refused = accept(calls, rules)
    if graph_fingerprint(gm) != before:  # a filter changed another node than the one it was asked about
        raise EdgeplugError(
            f"a partitioner filter of backend {ctx.backend!r} changed the program while answering (a node's op "
            "or inputs, or the nodes themselves); filters only read the program they are handed: move the "
            "change into a pass (edgeplug_passes). `edgeplug plugins` lists the backend's filters; nothing was written"
        )
    tags = form_partitions(gm, calls, accepted)
    dropped: dict[str, str] = {}
    if constant_only_policy:
        tags, dropped = drop_constant_only(tags, ctx)
    tags.update(tag_constants(constants, tags, buffer_writes(gm, ctx.ep), delegate_buffers=delegate_buffers))
    tags = {n: tags[n] for n in gm.graph.nodes if n in tags}
    specs = {tag: inner_specs.get(calls.get(n) or constants.get(n)) for n, tag in tags.items()}
    reasons = cpu_reasons(gm, tags, {**refused, **dropped}, logged, explain)
    outcome = PartitionOutcome(
        tags=MappingProxyType({n.name: t for n, t in tags.items()}),
        partitions=partition_records(tags, {t: getattr(s, "backend_id", "?") for t, s in specs.items()}),
        cpu_reasons=MappingProxyType(reasons),
        refused=MappingProxyType(refused),
        stranded=stranded_nodes(gm, tags, reasons, kept_whole, fused),
    )
    return outcome, tags, specs
