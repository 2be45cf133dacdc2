"""edgeplug: a plugin framework for ExecuTorch backends.

This module is the user's surface; backend authors import from
``edgeplug.plugin``. Every other module may change without notice. The names,
one line each:

Lowering:

- ``backends``: ``backends() -> list[str]``, the installed, loadable backends.
- ``get_backend``: ``get_backend(name) -> Backend``, one backend resolved across every plugin.
- ``Backend``: one backend's records (spec, keep-whole ops, filters, fusion policies, kernels, passes).
- ``transform``: ``transform(ep, backend) -> ExportedProgram``, the export stage ``lower`` runs.
- ``fuse``: ``fuse(ep, backend) -> (ExportedProgram, list[FusionRecord])``, the core's fusions on an edge program.
- ``lower``: ``lower(model_or_ep, args, backend, *, verify=False, dry_run=False, ...) -> LoweringResult``.
- ``quantize``: ``quantize(model, args, backend, scheme, calibration=None) -> QuantizedModel``, the backend's quantizer; ``lower`` takes the result.
- ``QuantizedModel``: what ``quantize`` returns: the quantized program (``program``) and what was done (``quantization``).
- ``verify``: ``verify(result, backend) -> Verification``, the lowered program run and compared with eager.
- ``LoweringResult``: what ``lower`` returns: the report, the programs, ``save`` for the .pte.
- ``LoweringReport``: partitions, ops on the CPU and why, fusions, transforms, timings, verification.
- ``Verification``: each output of the lowered program compared with eager.
- ``register_plugin``: registers an in-process object of hook functions as a plugin (tests, embedding).
- ``unregister_plugin``: removes a plugin registered with ``register_plugin`` (by object or name).
- ``plugin_problems``: the plugins that were dropped (failed import, raising hook, invalid record), each with its cause.

Errors (all are ``EdgeplugError``):

- ``EdgeplugError``: the base class of every error edgeplug raises on purpose.
- ``UnknownBackendError``: no loadable backend has that name (the message says why).
- ``BackendUnavailableError``: the backend's delegate cannot be serialized here (e.g. a missing SDK).
- ``PluginConflictError``: two plugins contribute the same thing.
- ``PassError``: a pass failed or left a broken graph.
- ``LoweringError``: the lowering failed at a named stage.
- ``KernelError``: a host kernel refused or failed a call.
- ``VerificationError``: verification could not run the lowered program.
- ``RuntimeRefusedError``: ExecuTorch's runtime refused to load or run the program.
- ``OutputPathError``: the .pte or report cannot be written where asked.
- ``QuantizationError``: quantizing failed (the stage, and the graph node where calibration broke).
- ``ExecutorchVersionError``: the installed ExecuTorch lacks a feature edgeplug or the backend needs (it names the release that has it).

Records and ``hookimpl`` (also here for plugins written as ``@edgeplug.hookimpl``;
``edgeplug.plugin`` documents them): ``API_VERSION``, ``Availability``,
``BackendSpec``, ``FusionPolicy``, ``FusionRecord``, ``TransformRecord``,
``KeepWhole``, ``Kernel``, ``PartitionerFilter``, ``PassSpec``, ``QuantScheme``,
``hookimpl``.

Importing edgeplug is cheap: torch, executorch and the plugins load on first use.
"""

from __future__ import annotations


from edgeplug._errors import (
    BackendUnavailableError,
    EdgeplugError,
    ExecutorchVersionError,
    KernelError,
    LoweringError,
    OutputPathError,
    PassError,
    PluginConflictError,
    QuantizationError,
    RuntimeRefusedError,
    UnknownBackendError,
    VerificationError,
)
from edgeplug._hookspecs import hookimpl
from edgeplug._lazy import lazy_names as _lazy_names
from edgeplug._records import (
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
)

__version__ = "0.1.0"

# importing edgeplug changes nothing of the process: no import hook, no warnings filter (the previous API's
# module paths, edgeplug.partition and the like, are modules of their own: edgeplug._api.old_path)

_LAZY = {
    "backends": ("edgeplug._registry.lookup", "backends"),
    "get_backend": ("edgeplug._registry.lookup", "get_backend"),
    "Backend": ("edgeplug._backend", "Backend"),
    "transform": ("edgeplug._facade", "transform"),
    "fuse": ("edgeplug._facade", "fuse"),
    "lower": ("edgeplug._facade", "lower"),
    "LoweringResult": ("edgeplug._result", "LoweringResult"),
    "LoweringReport": ("edgeplug._report.records", "LoweringReport"),
    "Verification": ("edgeplug._report.records", "Verification"),
    "quantize": ("edgeplug._facade", "quantize"),
    "QuantizedModel": ("edgeplug._quantize.program", "QuantizedModel"),
    "verify": ("edgeplug._facade", "verify"),
    "register_plugin": ("edgeplug._registry.lookup", "register"),
    "unregister_plugin": ("edgeplug._registry.lookup", "unregister"),
    "plugin_problems": ("edgeplug._registry.lookup", "problems"),
}


__getattr__, __dir__ = _lazy_names(__name__, _LAZY)


__all__ = [
    "BackendUnavailableError",
    "EdgeplugError",
    "ExecutorchVersionError",
    "KernelError",
    "LoweringError",
    "QuantizationError",
    "OutputPathError",
    "PassError",
    "PluginConflictError",
    "RuntimeRefusedError",
    "UnknownBackendError",
    "VerificationError",
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
    "hookimpl",
    *_LAZY,
]
