"""Fusion: pattern matches become the fused ops a backend's ``FusionPolicy`` names.

Three phases, one module each:

1. ``decide_fusion`` (``edgeplug._fusion.decision``): every node is matched
   (``edgeplug._patterns.match_rms_norm``) against one constant analysis and
   each match gets a pure ``Decision``: outcome, what the fused op's weight
   is, and the reason;
2. fold (``edgeplug._fusion.apply``): every weight the decisions fold (Gemma's
   ``1 + w``, a static view or cast, a dequantized constant where the policy
   folds those) and every unit weight they need becomes a constant of the
   program in one ``edgeplug._graph.fold_constants`` call;
3. rewrite: each match is replaced by the policy's op (``policy.emits``,
   e.g. ``aten.rms_norm(input, normalized_shape, weight, eps)`` or
   ``et_vk.rms_norm(input, weight, eps)``), eps always explicit; where the
   norm is fused with a unit weight, the multiply after it stays.

Every candidate, fused or refused, yields a ``FusionRecord``. The core names
no fused op itself: the policy's target is resolved through torch's op
registry (after the policy's ``load_target``), so a plugin can emit any op.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

import torch
from torch.export import ExportedProgram

from edgeplug._backend import Backend
from edgeplug._errors import EdgeplugError
from edgeplug._fusion.apply import decide_fusions, fuse_matches
from edgeplug._fusion.decision import Decision, decide_fusion
from edgeplug._fusion.delegation import Veto, delegation_veto
from edgeplug._graph.names import name_signature_as_graph
from edgeplug._policy_target import FusedOp, PolicyTargetError, check_policy, resolve_target
from edgeplug._records import FusionPolicy, FusionRecord
from edgeplug._registry.lookup import get_backend


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


def _resolved(policy: FusionPolicy, dialect: Optional[str]) -> FusedOp:
    try:
        return resolve_target(policy, dialect)
    except PolicyTargetError as exc:
        raise EdgeplugError(
            f"the {policy.pattern} fusion policy of backend {policy.backend!r} names target {policy.target!r}, "
            f"which cannot be emitted: {exc}. Fix the plugin's edgeplug_fusion_policies."
        ) from exc


def _fuse(ep: ExportedProgram, fused: FusedOp, veto: Optional[Veto]) -> tuple[ExportedProgram, list[FusionRecord]]:
    ep = copy_program(ep)
    records = fuse_matches(ep, fused, veto)
    ep.graph_module.graph.lint()
    ep.graph_module.recompile()
    return ep, records


def fuse_for_backend(ep: ExportedProgram, backend: Any) -> tuple[ExportedProgram, list[FusionRecord]]:
    """``fuse_program`` under ``backend``'s rms_norm policy, only where the backend delegates the fused op.

    What ``edgeplug.fuse`` runs: a fusion the backend's support check would
    refuse (e.g. ``et_vk.rms_norm`` in bf16) is not made, and its record says why.
    """
    policy = backend.fusion_policy("rms_norm")
    if policy is None:
        return ep, []
    fused = _resolved(policy, ep.dialect)
    return _fuse(ep, fused, delegation_veto(backend, fused))


def fuse(ep: ExportedProgram, backend: str | Backend) -> tuple[ExportedProgram, list[FusionRecord]]:
    """``edgeplug.fuse``: the core's pattern fusions on an edge-dialect program under ``backend``'s
    policy (a name or a ``Backend``). Returns a new program (``ep`` is not changed) and one
    ``FusionRecord`` per match: fused, folded, fused with a unit weight, or rejected with its reason."""
    return fuse_for_backend(ep, backend if isinstance(backend, Backend) else get_backend(backend))


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


def copy_program(ep: ExportedProgram) -> ExportedProgram:
    """A copy whose graph, signature and constant tables can change; tensors are shared."""
    graph = copy.deepcopy(ep.graph_module.graph)
    gm = torch.fx.GraphModule(ep.graph_module, graph)
    gm.meta.update(ep.graph_module.meta)
    signature = copy.deepcopy(ep.graph_signature)
    # the copy's node names (fx renames builtins' names; an earlier pass may have replaced an output)
    name_signature_as_graph(signature, graph)
    return ep._update(gm, signature, state_dict=dict(ep.state_dict), constants=dict(ep.constants))


__all__ = [
    "Decision",
    "FusedOp",
    "PolicyTargetError",
    "Veto",
    "check_policy",
    "copy_program",
    "decide_fusion",
    "decide_fusions",
    "delegation_veto",
    "fuse",
    "fuse_for_backend",
    "fuse_program",
    "fusion_stage",
    "resolve_target",
]
