"""The fusion of a program: one walk through the phases (``edgeplug._fusion``'s docstring), each
entered once.

``fuse_program`` fuses under a policy (``quantize`` recomposes norms with it); ``fuse_for_backend``
under a backend's policy, only where the backend delegates the fused op (what ``lower`` and
``edgeplug.fuse`` run): which ops the backend delegates is the partition's knowledge, handed in as
``delegation`` (``edgeplug._partition.delegation``). Every candidate, fused or refused, yields a
``FusionRecord``.
"""

from __future__ import annotations

from typing import Callable, Optional

from torch.export import ExportedProgram

from edgeplug._backend import Backend
from edgeplug._errors import EdgeplugError
from edgeplug._fusion.decision import Decision, Veto, decide_fusions
from edgeplug._fusion.fold import fold_weights
from edgeplug._fusion.ops import GraphOps
from edgeplug._fusion.rewrite import rewrite_all
from edgeplug._fusion.rms_norm import find_rms_norms
from edgeplug._fusion.target import FusedOp, PolicyTargetError, resolve_target
from edgeplug._graph.names import copy_graph
from edgeplug._records import FusionPolicy, FusionRecord

#: for the op a policy creates, a veto refusing a fusion the backend would not delegate (the partition
#: package's knowledge, handed in: ``edgeplug._partition.delegation``)
Delegation = Callable[[FusedOp], Veto]


def fuse_program(
    ep: ExportedProgram, policy: Optional[FusionPolicy], *, veto: Optional[Veto] = None
) -> tuple[ExportedProgram, list[FusionRecord]]:
    """Fuse every RMSNorm of ``ep`` under ``policy``; a stable entry point.

    ``ep`` is an aten-dialect program (``torch.export.export(...)``, e.g. to
    recompose norms before ``prepare_pt2e`` so a quantizer annotates one op)
    or an edge-dialect one (``to_edge(...).exported_program()``). Returns a
    new program (``ep``, its graph, signature and constant tables are left as
    they were) and one ``FusionRecord`` per candidate: ``fused``,
    ``folded_weight``, ``fused_unit_weight`` or ``rejected`` with its reason.
    ``policy=None`` gives ``ep`` back unchanged. ``veto(decision)`` may
    refuse a fusion with a reason (e.g. the backend would not delegate it).

    Raises ``EdgeplugError`` when the policy's target cannot be emitted.
    """
    if policy is None:
        return ep, []
    return _fuse(ep, _resolved(policy, ep.dialect), veto)


def fuse_for_backend(
    ep: ExportedProgram, backend: Backend, delegation: Delegation
) -> tuple[ExportedProgram, list[FusionRecord]]:
    """``fuse_program`` under ``backend``'s rms_norm policy, only where the backend delegates the fused op.

    What ``lower`` and ``edgeplug.fuse`` run: a fusion ``delegation``'s veto refuses (the backend's
    support check would not take the op, e.g. ``et_vk.rms_norm`` in bf16) is not made, and its record
    says why.
    """
    policy = backend.fusion_policy("rms_norm")
    if policy is None:
        return ep, []
    fused = _resolved(policy, ep.dialect)
    return _fuse(ep, fused, delegation(fused))


def fusion_stage(policy: Optional[FusionPolicy]) -> str:
    """Where ``lower`` applies ``policy``: ``"export"`` (the aten program) or ``"edge"``.

    A fused op in the ``aten`` namespace (``aten.rms_norm``) is not core ATen:
    ExecuTorch's edge verifier accepts it only when it was in the program
    before decomposition and a partitioner kept it whole, exactly as if the
    model had called it. So such a policy fuses the aten program, before
    ``to_edge``, and the op is then kept whole (and delegated) or decomposed
    like any op the model wrote. A backend's own op (``et_vk.rms_norm``) is
    outside the verifier's opset check: it fuses the edge program, after the
    core's constant folding. ``None`` (no policy): ``"edge"``.
    """
    if policy is None:
        return "edge"
    return "export" if str(policy.target).split(".", 1)[0] == "aten" else "edge"


def _resolved(policy: FusionPolicy, dialect: Optional[str]) -> FusedOp:
    try:
        return resolve_target(policy, dialect)
    except PolicyTargetError as exc:
        raise EdgeplugError(
            f"the {policy.pattern} fusion policy of backend {policy.backend!r} names target {policy.target!r}, "
            f"which cannot be emitted: {exc}. Fix the plugin's edgeplug_fusion_policies."
        ) from exc


def _fuse(ep: ExportedProgram, fused: FusedOp, veto: Optional[Veto]) -> tuple[ExportedProgram, list[FusionRecord]]:
    """The walk: copy, match, decide, fold, rewrite; each phase over the whole program, once."""
    ep = copy_graph(ep)
    items = decide_fusions(find_rms_norms(ep), fused, veto)
    ops = GraphOps(ep)
    weights = fold_weights(ep, fused, ops, [d for d in items if isinstance(d, Decision) and d.outcome != "rejected"])
    records = rewrite_all(ep, fused, ops, items, weights)
    ep.graph_module.graph.lint()
    ep.graph_module.recompile()
    return ep, records
