"""What a support check or a filter answers about one node, and what a filter sees.

Light on purpose (no executorch import): plugins' filters and support checks
import these while the rest of the partition package loads lazily.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch


@dataclass(frozen=True)
class Verdict:
    """Whether the backend takes a node, and if not, why (for the report).

    Falsy when refused, so ``if not verdict: print(verdict.reason)`` reads
    naturally, and a ``Verdict`` can stand wherever ``True``/``False`` did.
    """

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


TAKEN = Verdict(True)


def refuse(reason: str) -> Verdict:
    """A refusal with its reason: what a filter returns to say why (``Verdict(False, reason)``)."""
    return Verdict(False, reason)


class NotAnAnswer(TypeError):
    """A filter returned something outside its contract (what, and how to fix it, in the message)."""


def describe_answer(answer: Any) -> str:
    """What a filter returned, as an error shows it: its type and a bounded repr."""
    text = repr(answer)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(answer).__name__} {text}"


def filter_answer(answer: Any, name: str) -> Optional[Verdict]:
    """A partitioner filter's answer as a verdict: None (no opinion), taken, or refused.

    The answer must be exactly ``None``, ``True``, ``False`` or a ``Verdict``
    (``refuse(reason)``). Anything else raises ``NotAnAnswer``: a reason
    string, an uncalled ``refuse``, a number or ``"yes"`` would otherwise be
    read by truthiness and delegate (or refuse) the node silently.
    ``False`` is refused "by filter 'name'"; a falsy ``Verdict`` adds its own
    reason ("refused by filter 'name': rank 4 > 3").
    """
    if answer is None:
        return None
    if answer is True:
        return TAKEN
    if answer is False:
        return Verdict(False, f"refused by filter {name!r}")
    if isinstance(answer, Verdict):
        if answer.ok:
            return TAKEN
        why = f"refused by filter {name!r}"
        return Verdict(False, f"{why}: {answer.reason}" if answer.reason else why)
    if answer is refuse:
        fix = "call it with the reason: return refuse('why the backend cannot take this node')"
    elif isinstance(answer, str):
        fix = "to refuse with that reason, return refuse(" + repr(answer)[:60] + ")"
    elif callable(answer):
        fix = "call it and return its answer"
    else:
        fix = "convert it with bool(...) or return refuse('why') to refuse"
    raise NotAnAnswer(
        f"returned {describe_answer(answer)}; a filter answers None (no opinion), True, False "
        f"or a Verdict (refuse('why')), nothing else: {fix}"
    )


def support_answer(answer: Any, who: str) -> Verdict:
    """A support check's answer (a ``Verdict`` or a bool) as a verdict."""
    if isinstance(answer, Verdict):
        return answer
    return TAKEN if answer else Verdict(False, f"refused by the {who} support check")


@dataclass(frozen=True)
class FilterContext:
    """What a partitioner filter sees besides the node.

    ``stage`` is "before_decomposition" (aten graph, deciding keep-whole) or
    "partition" (edge graph, deciding delegation). ``constant_only`` holds the
    nodes of ``ep`` that read no runtime input (empty unless the backend has
    ``constant_only_policy``).
    """

    stage: str
    ep: Optional[Any] = None
    constant_only: frozenset = frozenset()
    backend: str = ""

    def is_constant_only(self, node: torch.fx.Node) -> bool:
        return node in self.constant_only
