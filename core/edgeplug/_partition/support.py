"""The backend's per-node support check, and the reasons an executorch partitioner logs.

A backend states what it delegates in two places: its executorch partitioner
(``BackendSpec.partitioner``), which tags nodes, and, optionally, a per-node
check (``BackendSpec.support_check``) the core can ask about any single node,
before decomposition (keep whole or not), for the report (why a node stays on
the CPU), and for fusion (is the fused op delegated?). The core knows no
backend: the check comes from the plugin.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from typing import Any, Callable, Iterator, Optional

import torch
from executorch.exir.backend.canonical_partitioners.config_partitioner import format_target_name
from executorch.exir.passes.replace_aten_with_edge_pass import aten_to_edge

from edgeplug._backend import Backend
from edgeplug._graph.ops import op_name
from edgeplug._partition.verdict import Verdict, support_answer

log = logging.getLogger(__name__)

#: ``check(node) -> Verdict``: does the backend take this node, and if not, why.
SupportCheck = Callable[[torch.fx.Node], Verdict]


def _edge_op(target: Any) -> Any:
    """The edge-dialect op for an aten op (what partitioners' tables are keyed by)."""
    if not isinstance(target, torch._ops.OpOverload):
        return target

    try:
        return aten_to_edge(target)
    except Exception:
        return target


@contextlib.contextmanager
def _as_edge_node(node: torch.fx.Node) -> Iterator[torch.fx.Node]:
    """Present an aten node (before decomposition) to a check written for edge ops."""
    original = node.target
    node.target = _edge_op(original) if node.op == "call_function" else original
    try:
        yield node
    finally:
        node.target = original


def _guarded(raw: Callable[[torch.fx.Node], Any], who: str) -> SupportCheck:
    """``raw`` made safe to ask about any node: aten or edge, never raising, always a Verdict."""

    def check(node: torch.fx.Node) -> Verdict:
        try:
            if isinstance(node.target, torch._ops.OpOverload):
                with _as_edge_node(node) as n:
                    return support_answer(raw(n), who)
            return support_answer(raw(node), who)
        except Exception as exc:  # a check written for edge graphs choking on aten args
            log.warning("the %s support check raised on %s: %r", who, node.name, exc)
            return Verdict(False, f"the {who} support check raised {type(exc).__name__}: {exc}")

    return check


def _takes_program(factory: Callable[..., Any]) -> bool:
    """Whether ``BackendSpec.support_check`` takes the program (a ``program`` parameter, or ``**kwargs``)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return "program" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def support_check(
    backend: Backend | Any,
    gm: Optional[torch.fx.GraphModule] = None,
    *,
    partitioner: Any = None,
    program: Any = None,
) -> Optional[SupportCheck]:
    """The backend's per-node support check: ``check(node) -> Verdict`` with a reason.

    ``backend`` is a resolved ``Backend`` (``edgeplug.get_backend(name)``), or
    an executorch partitioner alone (its ``verdict`` method, if it has one).
    ``gm`` is the graph about to be (or just) partitioned, for checks that
    look at patterns around a node; ``partitioner`` the executorch partitioner
    the backend made (one is made when not given). The check takes aten
    (before decomposition) and edge nodes alike, never raises, and answers
    ``Verdict(True)`` or ``Verdict(False, reason)``.

    It comes from ``BackendSpec.support_check(partitioner, gm)`` (``program=``: the edge program being
    partitioned, or None, for a factory that takes it, as a backend's own checker built over the
    program does), else from a
    partitioner with a ``verdict(node)`` method (``SupportTablePartitioner``).
    None when the backend states neither: the core then knows support only
    from what the partitioner tags.
    """
    if not isinstance(backend, Backend):  # a partitioner alone
        backend, partitioner = None, backend
    elif partitioner is None:
        partitioner = backend.make_partitioner()
    who = type(partitioner).__name__
    factory = backend.spec.support_check if backend is not None else None
    if factory is not None:
        made = (  # a check that names a third parameter takes the program too (_takes_program)
            factory(partitioner, gm, program=program)  # type: ignore[call-arg]
            if _takes_program(factory) else factory(partitioner, gm)
        )
        return _guarded(made, who)
    if callable(getattr(partitioner, "verdict", None)):
        return _guarded(partitioner.verdict, who)
    return None


# -- executorch partitioners' own reasons ----------------------------------------


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
def capture_why(partitioner: Any) -> Iterator[dict[str, str]]:
    """Node name -> the reason ``partitioner`` logged for not taking it, while the block runs."""
    package = ".".join(type(partitioner).__module__.split(".")[:3])
    logger = logging.getLogger(package)
    handler = _WhyCapture()
    handler.forward_from = logger.getEffectiveLevel()
    saved = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # the debug records we enabled are ours alone
    try:
        yield handler.reasons
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def unstated_reason(partitioner: Any, node: torch.fx.Node) -> str:
    """Why ``partitioner`` did not take ``node`` when it logged nothing."""
    who = type(partitioner).__name__
    configs = getattr(partitioner, "target_partitioner_configs", None)
    if isinstance(configs, dict):  # executorch's config-based partitioners
        if format_target_name(getattr(node.target, "__name__", "")) not in configs:
            return f"{who} has no config for {op_name(node.target)}"
    if logging.root.manager.disable >= logging.DEBUG:  # the reasons are debug records
        return (
            f"not taken by the {who} partitioner (its reason is a log record, and logging.disable("
            f"{logging.getLevelName(logging.root.manager.disable)}) is in effect; raise the loggers' levels instead)"
        )
    return f"not taken by the {who} partitioner (it gave no reason)"
