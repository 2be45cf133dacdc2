"""Validation across plugins: conflicts make only the contested backend unavailable.

Two backends of one name, two kernels for one op and device, two fusion
policies for one pattern (or a policy whose target cannot be emitted), two
passes or quantization schemes of one name, and pass constraints naming no
pass or forming a cycle are ``BackendProblem``s; a record for a backend no
loaded plugin registers is an ``UnclaimedRecord``.
"""

from __future__ import annotations

from typing import Optional

from edgeplug._fusion.target import PolicyTargetError, check_policy
from edgeplug._records import BackendSpec, FusionPolicy, Kernel, PassSpec, QuantScheme
from edgeplug._registry.info import BackendProblem, Contribution, Loaded, UnclaimedRecord, who
from edgeplug._registry.ordering import order_passes

def policy_problem(c: Contribution) -> Optional[str]:
    """Why a fusion policy's target cannot be emitted, for targets resolvable at load (no ``load_target``).

    A policy with ``load_target`` (a custom-op library, often slow to import)
    is checked by the conformance suite and when a program is fused.
    """
    policy = c.record
    if getattr(policy, "load_target", None) is not None:
        return None
    try:
        check_policy(policy)
    except PolicyTargetError as exc:
        return (
            f"the {getattr(policy, 'pattern', '')} fusion policy from {who(c.plugin)} cannot be emitted: {exc}; "
            "fix the plugin's FusionPolicy"
        )
    return None



def check(state: Loaded) -> None:
    """Conflicts make their backend unavailable; records for no registered backend are set aside."""
    specs: dict[str, Contribution] = {}
    for c in state.contributions:
        if not isinstance(c.record, BackendSpec):
            continue
        first = specs.get(c.record.backend)
        if first is None:
            specs[c.record.backend] = c
        elif c.record.backend not in state.conflicts:
            state.conflicts[c.record.backend] = BackendProblem(
                c.record.backend,
                f"backend {c.record.backend!r} is registered twice: by {who(first.plugin)} and by "
                f"{who(c.plugin)}",
                (first.plugin, c.plugin),
            )
    registered = tuple(sorted(specs))
    keep: list[Contribution] = []
    for c in state.contributions:
        if c.record.backend in specs:
            keep.append(c)
        else:
            state.unclaimed.append(UnclaimedRecord(c, registered))
    state.contributions = keep
    seen: dict[tuple, Contribution] = {}
    for c in keep:
        rec, what = c.record, ""
        key: Optional[tuple] = None
        if isinstance(rec, Kernel):
            key = ("kernel", rec.backend, rec.op, rec.device)
            what = f"two kernels for op {rec.op!r} on backend {rec.backend!r} ({rec.device})"
        elif isinstance(rec, FusionPolicy):
            pattern = getattr(rec, "pattern", "")
            key = ("policy", rec.backend, pattern)
            what = f"two fusion policies for pattern {pattern!r} on backend {rec.backend!r}"
        elif isinstance(rec, PassSpec):
            key = ("pass", rec.backend, rec.name)
            what = f"two passes named {rec.name!r} on backend {rec.backend!r}"
        elif isinstance(rec, QuantScheme):
            key = ("scheme", rec.backend, rec.scheme)
            what = f"two quantization schemes named {rec.scheme!r} on backend {rec.backend!r}"
        if key is None:
            continue
        first = seen.setdefault(key, c)
        if first is not c and rec.backend not in state.conflicts:
            state.conflicts[rec.backend] = BackendProblem(
                rec.backend, f"{what}: from {who(first.plugin)} and from {who(c.plugin)}", (first.plugin, c.plugin)
            )
    for c in keep:
        problem = policy_problem(c) if isinstance(c.record, FusionPolicy) else None
        if problem is not None and c.record.backend not in state.conflicts:
            state.conflicts[c.record.backend] = BackendProblem(c.record.backend, problem, (c.plugin,))
    for name in specs:
        if name in state.conflicts:
            continue
        passes = [c for c in keep if isinstance(c.record, PassSpec) and c.record.backend == name]
        try:
            state.pass_order[name] = tuple(c.record for c in order_passes(passes))
        except ValueError as exc:
            state.conflicts[name] = BackendProblem(name, str(exc), tuple(dict.fromkeys(c.plugin for c in passes)))
