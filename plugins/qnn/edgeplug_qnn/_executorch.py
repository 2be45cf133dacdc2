"""The qnn plugin's one module that reaches into executorch's internals (the core's
``tests/test_executorch_boundary.py`` fails on a reach anywhere else in the plugin)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator


@contextlib.contextmanager
def preprocess_multimethod_replaced(replacement: Callable[[Any, dict, dict], dict]) -> Iterator[None]:
    """Inside: ``QnnBackend.preprocess_multimethod(edge_programs, compile_specs)`` is
    ``replacement(original, edge_programs, compile_specs)``, where ``original(edge_programs, compile_specs)`` calls
    executorch's own; the original is put back on exit, errors included (``edgeplug_qnn.saver`` says why)."""
    from executorch.backends.qualcomm.qnn_preprocess import QnnBackend

    original = QnnBackend.__dict__["preprocess_multimethod"]
    if not isinstance(original, staticmethod):
        from edgeplug.plugin import lacks_executorch_feature

        raise lacks_executorch_feature(
            "QnnBackend.preprocess_multimethod as a static method", "recording each QNN partition with the saver"
        )

    def call(edge_programs: dict, compile_specs: dict) -> dict:
        return replacement(original.__func__, edge_programs, compile_specs)

    QnnBackend.preprocess_multimethod = staticmethod(call)
    try:
        yield
    finally:
        QnnBackend.preprocess_multimethod = original
