"""The core partitioner: one predicate decides "keep whole" and "delegate".

Today each executorch backend answers two questions separately: which ops to
keep whole before decomposition (``ops_to_not_decompose``) and which nodes to
delegate (``partition``). When the answers disagree a kept-whole op is left
whole on the CPU, and lowering fails late with "... was not decomposed or
delegated". ``CorePartitioner`` asks one predicate, ``delegable(node, ctx)``,
at every stage:

- ``before_decomposition``: an op of the backend's skip tables is kept whole
  only where ``delegable`` says the backend will take that node; otherwise it
  is decomposed into ops the backend (or the CPU) runs.
- ``partition``: the wrapped executorch partitioner tags nodes; the core then
  applies the same policy and filters to its result (a node they refuse is
  taken back out), and records a reason for every node left on the CPU.
- ``after_lowering``: the plain check. Any kept-whole op still in the
  top-level graph is reported with op, node and why (``stranded``); executorch
  raises on it too. Filters cannot silence this check.

``delegable`` is: the backend's support check (read from the wrapped
partitioner, see ``support_check``), then the partitioner filters plugins
register (``False`` refuses a node), then, for backends with
``BackendSpec.constant_only_policy`` (HTP), the constant-only rule: a node
that reads no runtime input is not delegated, unless a filter accepts it
explicitly (quantize/dequantize of a weight: the backend builds its weight
encodings from them). Constant-only-ness comes from
``edgeplug.graph.constant_only_nodes``.

``SupportTablePartitioner`` is for backends whose own partitioner needs a
vendor SDK just to be constructed (QNN, Samsung): it partitions from a table
of supported edge ops the plugin declares, and gives a reason for each refusal.
"""

from __future__ import annotations

import contextlib
import logging
import operator
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data
from torch.export import ExportedProgram
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from edgeplug.backend import Backend
from edgeplug.errors import EdgeplugError

log = logging.getLogger(__name__)

STAGES = ("before_decomposition", "partition", "after_lowering")


def op_name(target: Any) -> str:
    """A short, stable name for an op target: 'aten.linear.default'."""
    t = aten_overload(target)
    schema = getattr(t, "_schema", None)
    if schema is not None and hasattr(t, "_overloadname"):
        return f"{schema.name.replace('::', '.')}.{t._overloadname}"
    return getattr(t, "__name__", None) or str(t)


def aten_overload(target: Any) -> Any:
    """The aten OpOverload behind an edge op (or the target itself)."""
    if isinstance(target, torch._ops.OpOverload):
        return target
    return getattr(target, "_op", target)


_QUANT_PREFIXES = ("quantize", "dequantize", "choose_qparams")


def is_quantize_op(target: Any) -> bool:
    """quantize/dequantize/choose_qparams of any namespace (quantized_decomposed, torchao)."""
    schema = getattr(aten_overload(target), "_schema", None)
    if schema is None:
        return False
    return schema.name.split("::")[-1].startswith(_QUANT_PREFIXES)


@dataclass(frozen=True)
class Verdict:
    """Whether the backend takes a node, and if not, why (for the report)."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


TAKEN = Verdict(True)


@dataclass
class FilterContext:
    """What a partitioner filter sees besides the node.

    ``stage`` is "before_decomposition" (aten graph, deciding keep-whole) or
    "partition" (edge graph, deciding delegation). ``constant_only`` holds the
    nodes of ``ep`` that read no runtime input (empty unless the backend has
    ``constant_only_policy``).
    """

    stage: str
    ep: Optional[ExportedProgram] = None
    constant_only: frozenset = frozenset()
    backend: str = ""

    def is_constant_only(self, node: torch.fx.Node) -> bool:
        return node in self.constant_only


@dataclass
class PartitionRecord:
    tag: str
    backend_id: str
    nodes: list[str] = field(default_factory=list)
    ops: Counter = field(default_factory=Counter)


@dataclass(frozen=True)
class StrandedNode:
    """A kept-whole op left on the CPU: it was neither delegated nor decomposed."""

    node: str
    op: str
    reason: str

    def describe(self) -> str:
        return f"node {self.node!r} ({self.op}): {self.reason}"


# -- the backend's support check, read from its executorch partitioner ---------

SupportCheck = Callable[[torch.fx.Node], Verdict]


def _edge_op(target: Any) -> Any:
    """The edge-dialect op for an aten op (what partitioners' tables are keyed by)."""
    if not isinstance(target, torch._ops.OpOverload):
        return target
    from executorch.exir.passes.replace_aten_with_edge_pass import aten_to_edge

    try:
        return aten_to_edge(target)
    except Exception:
        return target


@contextlib.contextmanager
def _as_edge_node(node: torch.fx.Node) -> Iterator[torch.fx.Node]:
    """Present an aten node (before decomposition) to a check written for edge ops."""
    original = node.target
    edge = _edge_op(original) if node.op == "call_function" else original
    node.target = edge
    try:
        yield node
    finally:
        node.target = original


def _vulkan_check(vk: Any, gm: Optional[torch.fx.GraphModule]) -> SupportCheck:
    """VulkanPartitioner's own ``VulkanSupportedOperators``, with its refusal reasons."""
    from executorch.backends.vulkan import utils as vk_utils
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanSupportedOperators

    options = vk.options
    if "texture_limits" in options:
        limits = options["texture_limits"]
    elif options.get("small_texture_limits", False):
        limits = vk_utils.SMALL_TEXTURE_LIMITS
    else:
        limits = vk_utils.DEFAULT_TEXTURE_LIMITS
    fusable = []
    if gm is not None:
        import executorch.backends.vulkan.patterns as vk_patterns

        fusable = vk_patterns.get_all_fusable_subgraphs(gm)
    ops = VulkanSupportedOperators(
        limits,
        options.get("buffer_limit", vk_utils.DEFAULT_BUFFER_LIMIT),
        require_dynamic_shape=options.get("require_dynamic_shapes", False),
        skip_bool_tensors=options.get("skip_bool_tensors", False),
        operator_blocklist=vk.operator_blocklist,
        operator_allowlist=vk.operator_allowlist,
        fusable_subgraphs=fusable,
        nn_module_blocklist=vk.nn_module_blocklist,
        nn_module_allowlist=vk.nn_module_allowlist,
    )
    last: dict[str, str] = {}
    # log_skip is where Vulkan states its reason; keep it instead of logging it
    ops.log_skip = lambda node, reason: last.__setitem__("reason", str(reason))

    def check(node: torch.fx.Node) -> Verdict:
        last.clear()
        if ops.is_node_supported({}, node):
            return TAKEN
        return Verdict(False, f"Vulkan: {last.get('reason', 'not supported')}")

    return check


def support_check(partitioner: Any, gm: Optional[torch.fx.GraphModule] = None) -> Optional[SupportCheck]:
    """The node-level support check behind ``partitioner.partition``, if the core knows it.

    ``gm`` is the graph about to be (or just) partitioned, for checks that
    look at patterns around a node. Returns None for partitioners whose check
    is not reachable; the core then uses their own ``ops_to_not_decompose``
    filter and the reasons they log (executorch's ``WhyNoPartition``).
    """
    if hasattr(partitioner, "verdict"):
        return partitioner.verdict
    cls = type(partitioner).__name__
    if cls == "WebGPUPartitioner":
        vk = getattr(partitioner, "_vulkan_partitioner", None)
        if vk is not None:
            return _vulkan_check(vk, gm)
    if cls == "VulkanPartitioner":
        return _vulkan_check(partitioner, gm)
    return None


class _WhyCapture(logging.Handler):
    """Collects executorch ``WhyNoPartition`` reasons logged during a partition call."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reasons: dict[str, str] = {}
        self.forward_from = logging.WARNING

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.msg
        node = getattr(msg, "node", None)
        reason = getattr(msg, "reason", None)
        if isinstance(node, torch.fx.Node) and reason:
            self.reasons.setdefault(node.name, str(reason))
        elif record.levelno >= self.forward_from:
            logging.getLogger().handle(record)


@contextlib.contextmanager
def _capture_why(package: str) -> Iterator[_WhyCapture]:
    logger = logging.getLogger(package)
    handler = _WhyCapture()
    handler.forward_from = logger.getEffectiveLevel()
    saved = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # the debug records we enabled are ours alone
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def _is_op_node(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is not operator.getitem


# -- the core partitioner -----------------------------------------------------


class CorePartitioner(Partitioner):
    """Wraps ``backend``'s partitioner; in ``dry_run`` mode it delegates nothing.

    After ``partition`` ran: ``partitions`` (what was or would be delegated),
    ``cpu_reasons`` (node name -> why it stays on the CPU) and ``stranded``
    (kept-whole ops left on the CPU; empty when lowering is sound).
    """

    def __init__(self, backend: Backend, *, dry_run: bool = False) -> None:
        self.backend = backend
        root = logging.getLogger()
        level = root.level
        self.inner = backend.make_partitioner()
        root.setLevel(level)  # some executorch partitioners set the root logger to INFO on import
        self.dry_run = dry_run
        self.stage = "before_decomposition"
        self.partitions: list[PartitionRecord] = []
        self.cpu_reasons: dict[str, str] = {}
        self.stranded: list[StrandedNode] = []
        #: node name -> keep-whole decision made before decomposition (aten names)
        self.keep_decisions: dict[str, Verdict] = {}
        #: kept-whole ops the predicate refused, so they were decomposed: node -> (op, why)
        self.decomposed: dict[str, tuple[str, str]] = {}
        self._inner_keep: Optional[tuple[list[Any], Optional[Callable[[Any], bool]]]] = None
        super().__init__()

    @property
    def inner_name(self) -> str:
        return type(self.inner).__name__

    # the one predicate -------------------------------------------------------
    def context(self, ep: Optional[ExportedProgram], stage: str) -> FilterContext:
        constant_only: frozenset = frozenset()
        if ep is not None and self.backend.spec.constant_only_policy:
            from edgeplug.graph import constant_only_nodes

            constant_only = frozenset(constant_only_nodes(ep))
        return FilterContext(stage=stage, ep=ep, constant_only=constant_only, backend=self.backend.name)

    def _filters(self, node: torch.fx.Node, ctx: FilterContext) -> tuple[Optional[bool], str]:
        """Combined filter verdict: False if any refuses, True if any accepts, else None."""
        accepted: Optional[bool] = None
        for f in self.backend.filters:
            try:
                r = f.fn(node, ctx)
            except Exception as exc:
                origin = self.backend.origin(f)
                who = f"plugin {origin.name!r} ({origin.distribution})" if origin else "a plugin"
                raise EdgeplugError(
                    f"partitioner filter {f.name!r} of backend {self.backend.name!r} from {who} raised "
                    f"{type(exc).__name__}: {exc} at stage {ctx.stage!r} on node {node.name!r} "
                    f"({op_name(node.target)}); fix the filter or disable the plugin"
                ) from exc
            if r is None:
                continue
            if not r:
                return False, f"refused by filter {f.name!r}"
            accepted = True
        return accepted, ""

    def policy(self, node: torch.fx.Node, ctx: FilterContext) -> Verdict:
        """Filters and the constant-only rule (everything but the support table)."""
        verdict, why = self._filters(node, ctx)
        constant_only = self.backend.spec.constant_only_policy and ctx.is_constant_only(node)
        because = (
            f"constant-only: reads no runtime input ({self.backend.name} refuses graphs "
            "without one, so it runs on the CPU)"
        )
        if verdict is False:
            return Verdict(False, f"{because}; {why}" if constant_only else why)
        if constant_only:
            if verdict is not True:
                return Verdict(False, because)
            if ctx.stage == "partition" and any(ctx.is_constant_only(u) for u in node.users):
                # an accepted constant-only node (a weight dequantize) travels with
                # its consumers; one that also feeds constant-only CPU ops stays there
                return Verdict(False, "constant-only, and feeds constant-only ops that run on the CPU")
        return TAKEN

    def supported(self, node: torch.fx.Node, check: Optional[SupportCheck] = None) -> Verdict:
        """The backend's own support check for ``node`` (aten or edge dialect)."""
        if check is None:
            check = support_check(self.inner)
        if check is not None:
            try:
                if isinstance(node.target, torch._ops.OpOverload):
                    with _as_edge_node(node) as n:
                        return check(n)
                return check(node)
            except Exception as exc:  # a check written for edge graphs choking on aten args
                log.warning("the %s support check raised on %s: %r", self.inner_name, node.name, exc)
                return Verdict(False, f"the {self.inner_name} support check raised {type(exc).__name__}: {exc}")
        inner_filter = (self._inner_keep or ([], None))[1]
        if inner_filter is not None and not inner_filter(node):
            return Verdict(False, f"refused by the {self.inner_name} check")
        return TAKEN

    def delegable(self, node: torch.fx.Node, ctx: FilterContext, check: Optional[SupportCheck] = None) -> Verdict:
        """The one predicate: will the backend take this node?"""
        v = self.supported(node, check)
        if not v:
            return v
        return self.policy(node, ctx)

    # keep-whole ---------------------------------------------------------------
    def _inner_ops_to_not_decompose(self, ep: Optional[ExportedProgram]):
        """The wrapped partitioner's own answer (its filter is refreshed for every program)."""
        if hasattr(self.inner, "ops_to_not_decompose") and (ep is not None or self._inner_keep is None):
            ops, check = self.inner.ops_to_not_decompose(ep)
            self._inner_keep = (list(ops or []), check)
        return self._inner_keep or ([], None)

    def keep_whole_ops(self, ep: Optional[ExportedProgram] = None) -> list[Any]:
        """Every op the backend's skip tables and its partitioner name as keep-whole."""
        inner_ops = (self._inner_keep or self._inner_ops_to_not_decompose(ep))[0]
        return list(dict.fromkeys([*self.backend.skip_ops, *inner_ops]))

    def _decomposable_keep_ops(self) -> set[Any]:
        """Kept-whole ops that to_edge would otherwise decompose (keeping them was a choice)."""
        from executorch.exir.tracer import _default_decomposition_table

        table = _default_decomposition_table()
        return {op for op in self.keep_whole_ops() if op in table}

    def keep_whole(self, node: torch.fx.Node, ctx: FilterContext) -> Verdict:
        """Keep ``node`` whole iff it is a skip-table op the backend will take."""
        if node.op != "call_function" or aten_overload(node.target) not in set(self.keep_whole_ops()):
            return Verdict(False, "not a kept-whole op")
        return self.delegable(node, ctx)

    def ops_to_not_decompose(self, ep: ExportedProgram):
        self._inner_ops_to_not_decompose(ep)
        ops = self.keep_whole_ops(ep)
        if self.stage == "after_lowering":
            if self.dry_run:
                return [], None  # nothing was delegated; the core's own check ran in partition()
            keep = self._decomposable_keep_ops()
            return ops, lambda node: self._is_stranded(node, keep)
        ctx = self.context(ep, "before_decomposition")
        check = support_check(self.inner)  # pattern-aware checks need the edge graph; not yet
        kept = set(ops)

        def keep(node: torch.fx.Node) -> bool:
            v = self.delegable(node, ctx, check)
            self.keep_decisions[node.name] = v
            if not v.ok and node.op == "call_function" and aten_overload(node.target) in kept:
                self.decomposed[node.name] = (op_name(node.target), v.reason)
            return v.ok

        return ops, keep

    # partition ----------------------------------------------------------------
    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        self.stage = "partition"
        package = ".".join(type(self.inner).__module__.split(".")[:3])
        with _capture_why(package) as why:
            result = self.inner.partition(exported_program)
        ep = result.tagged_exported_program
        gm = ep.graph_module
        tags = dict(result.partition_tags)
        ctx = self.context(ep, "partition")
        self.cpu_reasons = {}
        self._inner_ops_to_not_decompose(ep)

        # the policy and filters have the last word on what the wrapped partitioner tagged
        for node in gm.graph.nodes:
            if _is_op_node(node) and node.meta.get("delegation_tag") is not None:
                v = self.policy(node, ctx)
                if not v:
                    node.meta.pop("delegation_tag")
                    self.cpu_reasons[node.name] = v.reason
        if self.backend.spec.constant_only_policy:
            members: dict[str, list[torch.fx.Node]] = {}
            for node in gm.graph.nodes:
                tag = node.meta.get("delegation_tag")
                if _is_op_node(node) and tag is not None:
                    members.setdefault(tag, []).append(node)
            for tag, nodes in members.items():
                if all(ctx.is_constant_only(n) for n in nodes):
                    for n in nodes:
                        n.meta.pop("delegation_tag")
                        self.cpu_reasons[n.name] = (
                            f"its partition reads no runtime input ({self.backend.name} refuses such partitions)"
                        )
        self._retag_constants(gm)
        used = {n.meta.get("delegation_tag") for n in gm.graph.nodes}
        tags = {t: s for t, s in tags.items() if t in used}

        # a reason for every node left on the CPU
        check = support_check(self.inner, gm)
        for node in gm.graph.nodes:
            if not _is_op_node(node) or node.meta.get("delegation_tag") is not None or node.name in self.cpu_reasons:
                continue
            if node.name in why.reasons:  # what the partitioner itself said
                self.cpu_reasons[node.name] = why.reasons[node.name]
                continue
            v = self.delegable(node, ctx, check) if check is not None else self.policy(node, ctx)
            if v:
                v = Verdict(False, self._unstated_reason(node))
            self.cpu_reasons[node.name] = v.reason

        keep = self._decomposable_keep_ops()
        self.stranded = [
            StrandedNode(
                node.name,
                op_name(node.target),
                f"kept whole before decomposition, but not delegated: {self.cpu_reasons.get(node.name, '?')}",
            )
            for node in gm.graph.nodes
            if node.meta.get("delegation_tag") is None and self._is_stranded(node, keep)
        ]

        by_tag: dict[str, PartitionRecord] = {}
        for node in gm.graph.nodes:
            tag = node.meta.get("delegation_tag")
            if not _is_op_node(node) or tag is None:
                continue
            spec = tags.get(tag)
            rec = by_tag.setdefault(tag, PartitionRecord(tag, getattr(spec, "backend_id", "?")))
            rec.nodes.append(node.name)
            rec.ops[op_name(node.target)] += 1
        self.partitions = list(by_tag.values())
        self.stage = "after_lowering"
        if self.dry_run:
            for node in gm.graph.nodes:
                node.meta.pop("delegation_tag", None)
            return PartitionResult(ep, {})
        return PartitionResult(ep, tags)

    def _unstated_reason(self, node: torch.fx.Node) -> str:
        configs = getattr(self.inner, "target_partitioner_configs", None)
        if isinstance(configs, dict):  # executorch's config-based partitioners (XNNPACK)
            from executorch.exir.backend.canonical_partitioners.config_partitioner import format_target_name

            if format_target_name(getattr(node.target, "__name__", "")) not in configs:
                return f"{self.inner_name} has no config for {op_name(node.target)}"
        return f"not taken by the {self.inner_name} partitioner (it gave no reason)"

    @staticmethod
    def _retag_constants(gm: torch.fx.GraphModule) -> None:
        """A constant stays with a delegate only while every user is in it."""
        for node in gm.graph.nodes:
            tag = node.meta.get("delegation_tag")
            if node.op == "placeholder" and tag is not None:
                if any(u.meta.get("delegation_tag") != tag for u in node.users):
                    node.meta.pop("delegation_tag")

    @staticmethod
    def _is_stranded(node: torch.fx.Node, keep: set[Any]) -> bool:
        # quantize/dequantize run on the CPU's quantized kernels (executorch's
        # own check exempts them too); a constant-only weight dequantize stays
        # there on purpose under the constant-only policy
        return (
            node.op == "call_function"
            and aten_overload(node.target) in keep
            and not is_quantize_op(node.target)
        )

    def stranded_message(self) -> str:
        lines = "; ".join(s.describe() for s in self.stranded)
        return (
            f"{len(self.stranded)} kept-whole op(s) left on the CPU for backend {self.backend.name!r}: {lines}. "
            "A pass after decomposition rebuilt them, or the partitioner refused them. Make the pass "
            "skip such nodes, or make the backend's support check or a partitioner filter refuse them "
            "before decomposition so they are decomposed."
        )


# -- SDK-free partitioning from a support table --------------------------------


class _TableSupport(OperatorSupportBase):
    def __init__(self, verdict: SupportCheck) -> None:
        self.verdict = verdict

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return self.verdict(node).ok


class SupportTablePartitioner(Partitioner):
    """Delegates every node whose (aten) op is in ``supported`` and dtype allowed."""

    def __init__(
        self,
        backend_id: str,
        supported: Iterable[Any],
        *,
        keep_whole: Iterable[Any] = (),
        dtypes: Iterable[torch.dtype] = (torch.float32, torch.float16, torch.int64, torch.int32, torch.bool),
        compile_specs: Optional[list[Any]] = None,
        name: str = "",
    ) -> None:
        super().__init__()
        self.backend_id = backend_id
        self.name = name or backend_id
        self.supported = {aten_overload(op) for op in supported}
        self.keep_whole = list(keep_whole)
        self.dtypes = set(dtypes)
        self.delegation_spec = DelegationSpec(backend_id, list(compile_specs or []))

    def verdict(self, node: torch.fx.Node) -> Verdict:
        if node.op != "call_function":
            return Verdict(False, "not an op")
        if aten_overload(node.target) not in self.supported:
            return Verdict(False, f"{op_name(node.target)} is not in the {self.name} support table")
        val = node.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else [val]
        for v in vals:
            if isinstance(v, torch.Tensor) and v.dtype not in self.dtypes:
                return Verdict(False, f"{self.name} does not support dtype {v.dtype} (output of {op_name(node.target)})")
        return TAKEN

    def ops_to_not_decompose(self, ep: Optional[ExportedProgram]):
        return [op for op in self.keep_whole if op in self.supported], lambda node: self.verdict(node).ok

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        gm = exported_program.graph_module
        partitions = CapabilityBasedPartitioner(
            gm, _TableSupport(self.verdict), allows_single_node_partition=True
        ).propose_partitions()
        tags: dict[str, DelegationSpec] = {}
        for p in partitions:
            tag = f"{self.backend_id}_{p.id}"
            for node in p.nodes:
                node.meta["delegation_tag"] = tag
            tags[tag] = self.delegation_spec
        tag_constant_data(exported_program)
        return PartitionResult(exported_program, tags)
