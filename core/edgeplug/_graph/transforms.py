"""Where graph transforms say what they changed.

A transform (the core's constant folding, a canonicalizing rewrite, or a
plugin's own pass) calls ``note(TransformRecord(...))`` for each change it
makes. ``lower`` collects them around the edge stage (``recording()``) into
the report's ``transforms``; outside a recording ``note`` keeps nothing, so
a transform can also be called on its own, where it returns its records.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Iterator, Optional

from edgeplug._records import TransformRecord

_LOG: ContextVar[Optional[list[TransformRecord]]] = ContextVar("edgeplug_transform_log", default=None)


def note(record: TransformRecord) -> None:
    """Add one change to the lowering being recorded (nothing outside ``recording()``)."""
    if not isinstance(record, TransformRecord):
        raise TypeError(f"note() takes a TransformRecord, not {type(record).__name__}")
    log = _LOG.get()
    if log is not None:
        log.append(record)


@contextlib.contextmanager
def recording() -> Iterator[list[TransformRecord]]:
    """Collect every ``note`` made inside the block into the list it yields."""
    log: list[TransformRecord] = []
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)
