"""``CorePartitioner``: the phases of ``edgeplug._partition.phases`` behind executorch's
``Partitioner`` interface, around the backend's own partitioner."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping, Optional

import torch
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from torch.export import ExportedProgram

from edgeplug._backend import Backend
from edgeplug._errors import LoweringError
from edgeplug._graph import constant_only_nodes
from edgeplug._graph.ops import aten_overload, is_qdq
from edgeplug._partition.phases import (
    KeepWholeDecisions,
    NodeCheck,
    PartitionOutcome,
    PartitionRecord,
    StrandedNode,
    as_to_edge_decomposes,
    decomposable,
    keep_whole_decisions,
    partition_graph,
    rules_verdict,
)
from edgeplug._partition.standin import STAND_IN_ID, check_with
from edgeplug._partition.support import SupportCheck, capture_why, support_check, unstated_reason
from edgeplug._partition.verdict import TAKEN, FilterContext, Verdict



def _fused_ops(backend: Backend) -> dict[str, str]:
    """Op name prefix -> pattern, for every op the backend's fusion policies create."""
    out = {}
    for policy in backend.fusion_policies:
        target = getattr(policy, "target", None)
        if target:
            out[str(target)] = str(getattr(policy, "pattern", "fusion"))
    return out


def _stand_in_spec(spec: Any, compiles_here: bool) -> Any:
    """``spec`` with the dry run's stand-in backend id (its compile specs kept); where the backend's compile
    step can run here, the stand-in runs it first (``check_with``)."""
    extra = [check_with(spec.backend_id)] if compiles_here else []
    return DelegationSpec(STAND_IN_ID, [*spec.compile_specs, *extra])


def _is_edge(ep: Optional[ExportedProgram]) -> bool:
    """An edge program: what executorch hands ``ops_to_not_decompose`` after lowering, to check what is left."""
    return getattr(ep, "dialect", "ATEN") == "EDGE"


class CorePartitioner(Partitioner):
    """One lowering's partitioner around ``backend``'s own; make one per lowering.

    What it is given is fixed when it is made: the backend, the executorch
    partitioner the backend builds (``inner``: made here by the backend's
    factory, or handed in, so that one lowering calls the factory once), its
    support check (``support``, which the fusion's veto asks too), and
    ``dry_run`` (partitions are lowered to the stand-in backend of
    ``edgeplug._partition.standin``: everything but the delegate's preprocess
    runs). Its answers depend only on the program it is asked about:

    - ``ops_to_not_decompose`` on the aten program (before decomposition)
      keeps a kept-whole op whole only where ``delegable`` says the backend
      takes the node; on an edge program (executorch's check after lowering)
      it names the kept-whole ops that must not be left in the graph.
    - ``partition`` asks ``inner`` what it supports, applies the filters and
      the constant-only rule, and forms the partitions itself. A real
      lowering that would strand an op on the CPU fails there, naming each.

    What it decided is kept as frozen records, each set once: the keep-whole
    decisions (``keep_decisions``, ``decomposed``) and the ``outcome`` of
    ``partition`` (``partitions``, ``cpu_reasons``, ``stranded`` read it). A
    second ``partition`` call is refused: a lowering makes a new one.
    """

    def __init__(self, backend: Backend, *, dry_run: bool = False, inner: Any = None) -> None:
        super().__init__()
        self.backend = backend
        self.dry_run = dry_run
        self.inner = inner if inner is not None else backend.make_partitioner()
        #: the backend's per-node check on any node (a pattern-aware one is made for the graph at partition)
        self._check: Optional[SupportCheck] = support_check(backend, None, partitioner=self.inner)
        self._fused = _fused_ops(backend)
        self._keep_whole: Optional[KeepWholeDecisions] = None
        self._outcome: Optional[PartitionOutcome] = None
        #: (aten program, that program as to_edge decomposes it), for the constant-only rule's keep-whole decisions
        self._decomposed: Optional[tuple[ExportedProgram, ExportedProgram]] = None

    # what it decided -----------------------------------------------------------------
    @property
    def support(self) -> Optional[SupportCheck]:
        """The backend's per-node support check on any node (None where the backend states none)."""
        return self._check

    @property
    def inner_name(self) -> str:
        return type(self.inner).__name__

    @property
    def outcome(self) -> Optional[PartitionOutcome]:
        """What ``partition`` decided (None before it ran)."""
        return self._outcome

    @property
    def keep_decisions(self) -> Mapping[str, Verdict]:
        """Node name -> whether it was kept whole (aten names), for each kept-whole op before decomposition."""
        return self._keep_whole.verdicts if self._keep_whole else MappingProxyType({})

    @property
    def decomposed(self) -> Mapping[str, tuple[str, str]]:
        """Kept-whole ops the backend refused, so they were decomposed: node -> (op, why)."""
        return self._keep_whole.decomposed if self._keep_whole else MappingProxyType({})

    @property
    def undone_fusions(self) -> Mapping[str, str]:
        """Of those, the fused ops a fusion made: the fusion's anchor -> why it was decomposed."""
        return self._keep_whole.undone_fusions if self._keep_whole else MappingProxyType({})

    @property
    def partitions(self) -> list[PartitionRecord]:
        return list(self._outcome.partitions) if self._outcome else []

    @property
    def cpu_reasons(self) -> dict[str, str]:
        return dict(self._outcome.cpu_reasons) if self._outcome else {}

    @property
    def stranded(self) -> list[StrandedNode]:
        return list(self._outcome.stranded) if self._outcome else []

    # the one predicate --------------------------------------------------------------------
    def context(self, ep: Optional[ExportedProgram], stage: str) -> FilterContext:
        constant_only: frozenset = frozenset()
        if ep is not None and self.backend.spec.constant_only_policy:
            constant_only = frozenset(constant_only_nodes(ep))
        return FilterContext(stage=stage, ep=ep, constant_only=constant_only, backend=self.backend.name)

    def delegable(self, node: torch.fx.Node, ctx: FilterContext) -> Verdict:
        """Will the backend take this node? Its support check, then the filters and the constant-only rule."""
        return self._delegable(node, ctx, self._support(ctx.ep))

    def _delegable(self, node: torch.fx.Node, ctx: FilterContext, support: NodeCheck) -> Verdict:
        supported = support(node)
        return self._rules(node, ctx) if supported else supported

    def _support(self, ep: Optional[ExportedProgram], check: Optional[SupportCheck] = None) -> NodeCheck:
        """The backend's own answer for nodes of ``ep``: its support check (``check``, else the one made
        without a graph), else its executorch partitioner's keep-whole check for ``ep``, else yes.

        The partitioner's check answers for the ops of its own ``ops_to_not_decompose`` list only: a node of
        an op a ``KeepWhole`` record adds is the plugin's to keep (its filters still apply, and an op the
        partitioner then does not take is reported as stranded, naming it), never refused in the
        partitioner's name for an op it was not asked about."""
        check = check or self._check
        if check is not None:
            return check
        inner_ops, inner_check = self._inner_keep(ep)
        if inner_check is None:
            return lambda node: TAKEN
        own = {aten_overload(op) for op in inner_ops}
        refused = Verdict(
            False, f"refused by {self.inner_name}.ops_to_not_decompose's check (it would not take the node whole)"
        )

        def support(node: torch.fx.Node) -> Verdict:
            if node.op == "call_function" and aten_overload(node.target) not in own:
                return TAKEN  # an op the plugin added (KeepWhole): not the partitioner's to answer
            return TAKEN if inner_check(node) else refused

        return support

    def _inner_keep(self, ep: Optional[ExportedProgram]) -> tuple[list[Any], Any]:
        """The executorch partitioner's own keep-whole answer for ``ep``: (ops, check or None)."""
        if not hasattr(self.inner, "ops_to_not_decompose"):
            return [], None
        ops, check = self.inner.ops_to_not_decompose(ep)
        return list(ops or []), check

    def _keep_ops(self, ep: Optional[ExportedProgram]) -> list[Any]:
        """Every op kept whole for ``ep``: the backend's keep-whole records, then its partitioner's own."""
        return list(dict.fromkeys([*self.backend.keep_whole, *self._inner_keep(ep)[0]]))

    def _rules(self, node: torch.fx.Node, ctx: FilterContext) -> Verdict:
        """The plugins' filters, then the constant-only rule (on a node the backend supports)."""
        return rules_verdict(
            node, ctx, self.backend.filters, constant_only_policy=self.backend.spec.constant_only_policy, origin=self.backend.origin
        )

    # keep whole ---------------------------------------------------------------------------
    def ops_to_not_decompose(self, ep: ExportedProgram):
        if _is_edge(ep):  # after lowering: executorch's own check that no kept-whole op is left
            ops = self._kept_ops(ep)
            keep = decomposable(ops)
            return ops, lambda node: aten_overload(node.target) in keep and not is_qdq(node.target)
        ops = self._keep_ops(ep)
        if self.backend.spec.constant_only_policy:
            # the constant-only rule reads the graph around a node: judge the kept ops' nodes in the program
            # to_edge makes, where a decomposition can give birth to more of them (an LSTM's aten.linear)
            ep = self._as_decomposed(ep, ops)
        ctx = self.context(ep, "before_decomposition")
        support = self._support(ep)  # pattern-aware checks need the edge graph; not yet
        decisions = keep_whole_decisions(ep.graph_module, ops, lambda n: self._delegable(n, ctx, support))
        self._keep_whole = decisions  # a function of the program (executorch asks about the same one more than once)
        if not decisions.decomposed:
            # every node of a kept op is kept: no per-node check is needed, and without one executorch
            # preserves the ops by leaving them out of its decomposition table. With one it renames the
            # kept nodes (EDGE_DO_NOT_DECOMP) and decomposes twice, which turns a reshape of a transposed
            # attention output into an invalid view (every transformers decoder on coreml, executorch 1.5)
            return ops, None
        verdicts = decisions.verdicts
        return ops, lambda node: (verdicts[node.name] if node.name in verdicts else self._delegable(node, ctx, support)).ok

    def _as_decomposed(self, ep: ExportedProgram, ops: list[Any]) -> ExportedProgram:
        """``as_to_edge_decomposes`` once per program (executorch asks about the same one more than once)."""
        if self._decomposed is None or self._decomposed[0] is not ep:
            self._decomposed = (ep, as_to_edge_decomposes(ep, ops))
        return self._decomposed[1]

    def _kept_ops(self, ep: ExportedProgram) -> list[Any]:
        """The ops kept whole before decomposition (those asked about the edge program when there was no aten one)."""
        return list(self._keep_whole.ops) if self._keep_whole is not None else self._keep_ops(ep)

    # partition ----------------------------------------------------------------------------
    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        if self._outcome is not None:
            raise LoweringError(
                f"this CorePartitioner for backend {self.backend.name!r} already partitioned a program; "
                "make a new one for each lowering"
            )
        with capture_why(self.inner) as logged:
            result = self.inner.partition(exported_program)
        ep = result.tagged_exported_program
        tags, specs = self._decide(ep, logged, dict(result.partition_tags))
        for node in ep.graph_module.graph.nodes:
            node.meta.pop("delegation_tag", None)
            if node in tags:
                node.meta["delegation_tag"] = tags[node]
        if self.stranded:  # fail here, before serialization, naming each op (dry run or not)
            raise LoweringError(self.stranded_message())
        if self.dry_run:  # the same partitions, lowered to the stand-in: only preprocess is skipped
            compiles_here = self.backend.availability().ok
            specs = {tag: _stand_in_spec(spec, compiles_here) for tag, spec in specs.items()}
        return PartitionResult(ep, specs)

    def _decide(self, ep: ExportedProgram, logged: dict[str, str], inner_specs: dict[str, Any]):
        """Run the phases on the tagged graph; set ``outcome``; return (node -> tag, tag -> spec)."""
        ctx = self.context(ep, "partition")
        check = support_check(self.backend, ep.graph_module, partitioner=self.inner, program=ep)
        support = self._support(ep, check)

        def explain(node: torch.fx.Node) -> Verdict:
            v = self._delegable(node, ctx, support) if check is not None else self._rules(node, ctx)
            if not v and check is not None:
                ruled = self._own_words(node, ctx)
                if ruled is not None:
                    return ruled
            return Verdict(False, unstated_reason(self.inner, node)) if v else v

        # where the partitioner logged why it left a node, a plugin filter that refuses the node too says
        # it in the backend's own words ("float64, so it stays on the CPU"), which say more ("invalid dtype")
        for node in ep.graph_module.graph.nodes:
            if node.name in logged:
                ruled = self._own_words(node, ctx)
                if ruled is not None:
                    logged[node.name] = ruled.reason

        self._outcome, tags, specs = partition_graph(
            ep.graph_module,
            ctx,
            rules=lambda n: self._rules(n, ctx),
            explain=explain,
            logged=logged,
            inner_specs=inner_specs,
            constant_only_policy=self.backend.spec.constant_only_policy,
            delegate_buffers=self.backend.spec.delegate_buffers,
            kept_whole=decomposable(self._kept_ops(ep)),
            fused=self._fused,
        )
        return tags, specs

    def _own_words(self, node: torch.fx.Node, ctx: FilterContext) -> Optional[Verdict]:
        """The plugin filters' refusal of a node the partitioner already left, for its reason only (None: none)."""
        if not self.backend.filters:
            return None
        try:
            ruled = self._rules(node, ctx)
        except Exception:  # asked about a node it was never shown: its answer explains nothing
            return None
        return None if ruled else ruled

    def stranded_message(self) -> str:
        lines = "; ".join(s.describe() for s in self.stranded)
        return (
            f"{len(self.stranded)} op(s) left on the CPU for backend {self.backend.name!r} that cannot run there "
            f"(kept whole for it, or created by a fusion for it): {lines}. "
            "A pass after decomposition rebuilt them, a fusion created an op the backend does not take, or "
            "the partitioner refused them. Make the pass skip such nodes, make the backend's support check or "
            "a partitioner filter refuse them before decomposition so they are decomposed, or make the fusion "
            "policy's target an op the backend delegates (for this dtype)."
        )
