"""Fusion only where it will be delegated: the partition's knowledge, handed to the fusion as a veto.

A fused op the backend's partitioner would not take (``et_vk.rms_norm`` in
bf16 on vulkan/webgpu, ``aten.rms_norm`` in bf16 on qnn) would be left on
the CPU, where nothing runs it ("Missing out variants" at serialization).
``delegation(backend, support)`` is what the fusion is handed
(``edgeplug._fusion.program.fuse_for_backend``): for the op a policy
creates, a veto asking the backend's per-node support check about a probe
of the op each decision would create, once per dtype and shape, and
refusing the fusion with the backend's reason. The check is the lowering's
own (its partitioner's, made once per lowering); ``edgeplug.fuse`` alone
makes one on its first question.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from edgeplug._backend import Backend
from edgeplug._fusion.decision import Decision, Veto
from edgeplug._fusion.nodes import dtype_name
from edgeplug._fusion.target import FusedOp
from edgeplug._partition.phases import decomposable
from edgeplug._partition.support import SupportCheck, support_check

#: the support check a veto asks, fetched on its first question (None: the backend states none)
Support = Callable[[], Optional[SupportCheck]]


def delegation(backend: Backend, support: Optional[Support] = None) -> Callable[[FusedOp], Veto]:
    """For the op a fusion would create, a veto refusing what ``backend`` would not delegate.

    ``support`` gives the backend's per-node check (the lowering's partitioner's); without it one is made
    from a new partitioner on the first question, so a program without norms pays nothing."""
    made: list[Optional[SupportCheck]] = []

    def fetch() -> Optional[SupportCheck]:
        if not made:
            made.append(support() if support is not None else support_check(backend, None))
        return made[0]

    return lambda fused: delegation_veto(backend, fused, fetch)


def delegation_veto(backend: Backend, fused: FusedOp, support: Support) -> Veto:
    """A veto refusing what ``backend`` would not delegate (nothing, where it states no support check)."""
    answers: dict[tuple, str] = {}
    undone: list[str] = []

    def veto(d: Decision) -> str:
        if not undone:
            undone.append(_undone_by_to_edge(backend, fused))
        if undone[0]:
            return undone[0]
        x = _input_value(d)
        key = (x.dtype, tuple(str(s) for s in x.shape), d.weight in ("as_is", "fold") or fused.unit_weight_is_ones)
        if key not in answers:
            check = support()
            if check is None:  # the backend states no per-node check: its partitioner alone decides
                return ""
            verdict = check(_probe(fused, d, x, with_weight=key[2]))
            answers[key] = "" if verdict else (
                f"the {backend.name} backend would not delegate {fused.policy.target} in {dtype_name(x.dtype)} "
                f"({verdict.reason or 'refused by its support check'}), so it is not created: the norm stays as it is"
            )
        return answers[key]

    return veto


def _undone_by_to_edge(backend: Backend, fused: FusedOp) -> str:
    """Why a fused aten op would not survive ``to_edge`` ("" when it would).

    ``to_edge`` decomposes an aten op of its decomposition table (``aten.rms_norm``
    is one) unless the partitioner keeps it whole, and the core keeps whole what
    the backend's KeepWhole records name. A fusion into an op the backend does
    not keep whole would be decomposed again while its record said "fused".
    """
    op = fused.op
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten" or not decomposable([op]):
        return ""
    if op in decomposable(tuple(backend.keep_whole)):
        return ""
    return (
        f"to_edge would decompose {fused.policy.target} again: backend {backend.name!r} does not keep "
        f"{fused.policy.target} whole. If its partitioner delegates the op, name it in the backend's KeepWhole record "
        "(edgeplug_keep_whole); the norm stays as it is"
    )


def _input_value(d: Decision) -> Any:
    m = d.match
    return (m.upcast.args[0] if d.absorb_upcast else m.input).meta["val"]


def _probe(fused: FusedOp, d: Decision, x: Any, *, with_weight: bool) -> torch.fx.Node:
    """The fused op alone in a graph of its own, its values fake: what the support check is asked about."""
    g = torch.fx.Graph()
    inp = g.placeholder("x")
    inp.meta["val"] = x
    weight = None
    if with_weight:
        weight = g.placeholder("weight")
        with x.fake_mode:
            weight.meta["val"] = torch.empty(d.match.dim, dtype=x.dtype)
    node = g.call_function(fused.op, fused.args(input=inp, dim=d.match.dim, weight=weight, eps=d.match.eps))
    with x.fake_mode:
        node.meta["val"] = torch.empty_like(x, memory_format=torch.contiguous_format)
    g.output(node)
    return node
