"""edgeplug: a plugin framework for ExecuTorch backends.

The public API (stable)::

    edgeplug.backends() -> list[str]
    edgeplug.get_backend(name) -> Backend
    edgeplug.transform(ep, backend) -> ExportedProgram
    edgeplug.fuse(ep, backend) -> (ExportedProgram, list[FusionRecord])
    edgeplug.lower(model_or_ep, example_inputs, backend, *, verify=False, dry_run=False) -> LoweringResult
    edgeplug.quantize(model, example_inputs, backend, scheme, calibration=None) -> torch.fx.GraphModule
        # the backend's own PT2E quantizer (edgeplug.quantization); lower() takes the result

Importing edgeplug is cheap: torch, executorch and the plugins load on first use.
"""

from __future__ import annotations

from typing import Any

from edgeplug.hookspecs import hookimpl
from edgeplug.records import (
    API_VERSION,
    Availability,
    BackendSpec,
    FusionPolicy,
    FusionRecord,
    TransformRecord,
    KeepWhole,
    Kernel,
    PartitionerFilter,
    PassSpec,
    QuantScheme,
    SkipDecomp,
)

__version__ = "0.1.0"

_LAZY = {
    "backends": ("edgeplug.backend", "backends"),
    "get_backend": ("edgeplug.backend", "get_backend"),
    "Backend": ("edgeplug.backend", "Backend"),
    "transform": ("edgeplug.pipeline", "transform"),
    "fuse": ("edgeplug.pipeline", "fuse"),
    "lower": ("edgeplug.pipeline", "lower"),
    "LoweringResult": ("edgeplug.pipeline", "LoweringResult"),
    "LoweringReport": ("edgeplug.report", "LoweringReport"),
    "quantize": ("edgeplug.quantization", "quantize"),
    "verify": ("edgeplug.pipeline", "verify"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    if name == "plugins":  # `edgeplug.plugins.register(...)` after a bare `import edgeplug`
        import importlib

        return importlib.import_module("edgeplug.plugins")
    raise AttributeError(f"module 'edgeplug' has no attribute {name!r}")


__all__ = [
    "API_VERSION",
    "Availability",
    "BackendSpec",
    "FusionPolicy",
    "FusionRecord",
    "TransformRecord",
    "KeepWhole",
    "Kernel",
    "PartitionerFilter",
    "PassSpec",
    "QuantScheme",
    "SkipDecomp",
    "hookimpl",
    *_LAZY,
]
