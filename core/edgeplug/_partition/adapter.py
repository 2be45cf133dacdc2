"""``CorePartitioner``: the phases of ``edgeplug._partition.phases`` behind executorch's
``Partitioner`` interface, around the backend's own partitioner."""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import torch
from executorch.exir.backend.partitioner import Partitioner, PartitionResult
from torch.export import ExportedProgram

from edgeplug._backend import Backend
from edgeplug._errors import LoweringError
from edgeplug._graph.ops import aten_overload, is_qdq, op_name
from edgeplug._partition import phases
from edgeplug._partition.phases import PartitionOutcome, PartitionRecord, StrandedNode
from edgeplug._partition.support import SupportCheck, capture_why, support_check, unstated_reason
from edgeplug._partition.verdict import TAKEN, FilterContext, Verdict


def _keep_whole_ops(backend: Backend) -> tuple[Any, ...]:
    return tuple(backend.keep_whole)


def _fused_ops(backend: Backend) -> dict[str, str]:
    """Op name prefix -> pattern, for every op the backend's fusion policies create."""
    out = {}
    for policy in backend.fusion_policies:
        target = getattr(policy, "target", None)
        if target:
            out[str(target)] = str(getattr(policy, "pattern", "fusion"))
    return out


def _stand_in(spec: Any) -> Any:
    """``spec`` with the dry run's stand-in backend id (its compile specs kept)."""
    from executorch.exir.backend.partitioner import DelegationSpec

    from edgeplug._partition.standin import STAND_IN_ID

    return DelegationSpec(STAND_IN_ID, list(spec.compile_specs))


class CorePartitioner(Partitioner):
    """Wraps ``backend``'s partitioner; in ``dry_run`` mode its partitions are lowered to a stand-in
    backend (``edgeplug._partition.standin``): everything but the delegate's preprocess runs.

    Before decomposition (``ops_to_not_decompose``) it keeps an op whole only
    where the backend takes the node. ``partition`` asks the backend's
    partitioner what it supports, applies the filters and the constant-only
    rule, and forms the partitions itself; its decisions are ``outcome``
    (``partitions``, ``cpu_reasons``, ``stranded`` read from it). A real
    lowering that would strand an op on the CPU fails there, naming each.
    """

    def __init__(self, backend: Backend, *, dry_run: bool = False) -> None:
        self.backend = backend
        root = logging.getLogger()
        level = root.level
        self.inner = backend.make_partitioner()
        root.setLevel(level)  # some executorch partitioners set the root logger to INFO on import
        self.dry_run = dry_run
        #: set by ``partition``
        self.outcome: Optional[PartitionOutcome] = None
        #: node name -> keep-whole decision made before decomposition (aten names)
        self.keep_decisions: dict[str, Verdict] = {}
        #: kept-whole ops the backend refused, so they were decomposed: node -> (op, why)
        self.decomposed: dict[str, tuple[str, str]] = {}
        self._inner_keep: Optional[tuple[list[Any], Optional[Callable[[Any], bool]]]] = None
        self._plain_check: Optional[tuple[Optional[SupportCheck]]] = None
        self._decomposable: Optional[frozenset] = None
        super().__init__()

    @property
    def inner_name(self) -> str:
        return type(self.inner).__name__

    @property
    def partitions(self) -> list[PartitionRecord]:
        return list(self.outcome.partitions) if self.outcome else []

    @property
    def cpu_reasons(self) -> dict[str, str]:
        return dict(self.outcome.cpu_reasons) if self.outcome else {}

    @property
    def stranded(self) -> list[StrandedNode]:
        return list(self.outcome.stranded) if self.outcome else []

    # the one predicate: support check, then filters and the constant-only rule ------
    def context(self, ep: Optional[ExportedProgram], stage: str) -> FilterContext:
        constant_only: frozenset = frozenset()
        if ep is not None and self.backend.spec.constant_only_policy:
            from edgeplug._graph import constant_only_nodes

            constant_only = frozenset(constant_only_nodes(ep))
        return FilterContext(stage=stage, ep=ep, constant_only=constant_only, backend=self.backend.name)

    def policy(self, node: torch.fx.Node, ctx: FilterContext) -> Verdict:
        """Filters, then the constant-only rule (everything but the support check)."""
        return phases.policy_verdict(
            node, ctx, self.backend.filters, constant_only_policy=self.backend.spec.constant_only_policy, origin=self.backend.origin
        )

    def support_check(self, gm: Optional[torch.fx.GraphModule] = None) -> Optional[SupportCheck]:
        """The backend's support check for this partitioner (see ``edgeplug._partition.support_check``)."""
        if gm is not None:
            return support_check(self.backend, gm, partitioner=self.inner)
        if self._plain_check is None:
            self._plain_check = (support_check(self.backend, None, partitioner=self.inner),)
        return self._plain_check[0]

    def supported(self, node: torch.fx.Node, check: Optional[SupportCheck] = None) -> Verdict:
        """The backend's own support check for ``node`` (aten or edge dialect)."""
        check = check or self.support_check()
        if check is not None:
            return check(node)
        inner_filter = (self._inner_keep or ([], None))[1]
        if inner_filter is not None and not inner_filter(node):
            return Verdict(False, f"refused by the {self.inner_name} check")
        return TAKEN

    def delegable(self, node: torch.fx.Node, ctx: FilterContext, check: Optional[SupportCheck] = None) -> Verdict:
        """The one predicate: will the backend take this node?"""
        v = self.supported(node, check)
        return self.policy(node, ctx) if v else v

    # keep whole ------------------------------------------------------------------------
    def _inner_ops_to_not_decompose(self, ep: Optional[ExportedProgram]):
        """The wrapped partitioner's own answer (its filter is refreshed for every program)."""
        if hasattr(self.inner, "ops_to_not_decompose") and (ep is not None or self._inner_keep is None):
            ops, check = self.inner.ops_to_not_decompose(ep)
            self._inner_keep = (list(ops or []), check)
        return self._inner_keep or ([], None)

    def keep_whole_ops(self, ep: Optional[ExportedProgram] = None) -> list[Any]:
        """Every op the backend's keep-whole records and its partitioner name as keep-whole."""
        inner_ops = (self._inner_keep or self._inner_ops_to_not_decompose(ep))[0]
        return list(dict.fromkeys([*_keep_whole_ops(self.backend), *inner_ops]))

    def _decomposable_keep_ops(self) -> frozenset:
        """Kept-whole ops that to_edge would otherwise decompose (keeping them was a choice)."""
        if self._decomposable is None:
            from executorch.exir.tracer import _default_decomposition_table

            table = _default_decomposition_table()
            self._decomposable = frozenset(op for op in self.keep_whole_ops() if op in table)
        return self._decomposable

    def keep_whole(self, node: torch.fx.Node, ctx: FilterContext) -> Verdict:
        """Keep ``node`` whole iff it is a kept-whole op the backend will take."""
        keep = frozenset(aten_overload(op) for op in self.keep_whole_ops())
        return phases.keep_whole_verdict(node, keep, lambda n: self.delegable(n, ctx))

    def ops_to_not_decompose(self, ep: ExportedProgram):
        self._inner_ops_to_not_decompose(ep)
        ops = self.keep_whole_ops(ep)
        if self.outcome is not None:  # after lowering: executorch's own check of what is left
            keep = self._decomposable_keep_ops()
            return ops, lambda node: aten_overload(node.target) in keep and not is_qdq(node.target)
        ctx = self.context(ep, "before_decomposition")
        check = self.support_check()  # pattern-aware checks need the edge graph; not yet
        kept = frozenset(aten_overload(op) for op in ops)

        def keep(node: torch.fx.Node) -> bool:
            v = self.delegable(node, ctx, check)
            self.keep_decisions[node.name] = v
            if not v.ok and node.op == "call_function" and aten_overload(node.target) in kept:
                self.decomposed[node.name] = (op_name(node.target), v.reason)
            return v.ok

        return ops, keep

    # partition ----------------------------------------------------------------------------
    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        with capture_why(self.inner) as logged:
            result = self.inner.partition(exported_program)
        ep = result.tagged_exported_program
        gm = ep.graph_module
        self._inner_ops_to_not_decompose(ep)
        tags, specs = self._decide(ep, logged, dict(result.partition_tags))
        for node in gm.graph.nodes:
            node.meta.pop("delegation_tag", None)
            if node in tags:
                node.meta["delegation_tag"] = tags[node]
        if self.outcome.stranded:  # fail here, before serialization, naming each op (dry run or not)
            raise LoweringError(self.stranded_message())
        if self.dry_run:  # the same partitions, lowered to the stand-in: only preprocess is skipped
            specs = {tag: _stand_in(spec) for tag, spec in specs.items()}
        return PartitionResult(ep, specs)

    def _decide(self, ep: ExportedProgram, logged: dict[str, str], inner_specs: dict[str, Any]):
        """Run the phases on the tagged graph; set ``outcome``; return (node -> tag, tag -> spec)."""
        ctx = self.context(ep, "partition")
        check = self.support_check(ep.graph_module)

        def explain(node: torch.fx.Node) -> Verdict:
            v = self.delegable(node, ctx, check) if check is not None else self.policy(node, ctx)
            return Verdict(False, unstated_reason(self.inner, node)) if v else v

        self.outcome, tags, specs = phases.decide(
            ep.graph_module,
            ctx,
            policy=lambda n: self.policy(n, ctx),
            explain=explain,
            logged=logged,
            inner_specs=inner_specs,
            constant_only_policy=self.backend.spec.constant_only_policy,
            kept_whole=self._decomposable_keep_ops(),
            fused=_fused_ops(self.backend),
        )
        return tags, specs

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
