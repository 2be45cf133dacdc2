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


def preprocess_result(payload: bytes, delegate_info: dict) -> Any:
    """executorch's ``PreprocessResult`` for one recorded partition, with ``delegate_info`` as its delegate info
    (the underscored ``_delegate_info_meta`` field, which the lowered module hands on to the core's report)."""
    import dataclasses

    from executorch.exir.backend.backend_details import PreprocessResult

    if "_delegate_info_meta" not in {f.name for f in dataclasses.fields(PreprocessResult)}:
        from edgeplug.plugin import lacks_executorch_feature

        raise lacks_executorch_feature(
            "PreprocessResult._delegate_info_meta", "reporting what the QNN saver recorded for each partition"
        )
    return PreprocessResult(processed_bytes=payload, debug_handle_map={}, _delegate_info_meta=delegate_info)


def ensure_qualcomm_importable() -> None:
    """Import ``executorch.backends.qualcomm`` once without its import-time SDK download.

    ExecuTorch 1.4's ``executorch/backends/qualcomm/__init__.py`` downloads and unpacks the QNN SDK (and a
    libc++) when ``QNN_SDK_ROOT`` is not set, and raises "Failed to set up QNN SDK" where it cannot: every
    import of the partitioner, even for a dry run that needs no SDK, would fetch gigabytes or fail offline.
    1.5 moved that setup to the code that starts a backend. Where ``QNN_SDK_ROOT`` is unset, the package is
    imported here once with ``EXECUTORCH_BUILDING_WHEEL=1`` (the switch that release reads to skip the
    setup), restored at once; later imports find it in ``sys.modules``. A real compile still needs the SDK,
    which the backend's availability check asks for.
    """
    import importlib
    import os
    import sys

    if "executorch.backends.qualcomm" in sys.modules or os.environ.get("QNN_SDK_ROOT"):
        return
    saved = os.environ.get("EXECUTORCH_BUILDING_WHEEL")
    os.environ["EXECUTORCH_BUILDING_WHEEL"] = "1"
    try:
        importlib.import_module("executorch.backends.qualcomm")
    finally:
        if saved is None:
            del os.environ["EXECUTORCH_BUILDING_WHEEL"]
        else:
            os.environ["EXECUTORCH_BUILDING_WHEEL"] = saved
