"""edgeplug.plugin: everything a backend author imports, in one module.

A plugin (``plugins/*`` in this repository, or a third party's distribution)
imports from ``edgeplug.plugin`` only (its tests use ``edgeplug`` and
``edgeplug.testing`` too); every other module of the core may change without
notice. The names, one line each:

Records (what hooks yield; ``help(edgeplug.plugin.hookspecs)`` has every hook's contract):

- ``API_VERSION``: the plugin API version this core speaks (``BackendSpec.api_version``).
- ``BackendSpec``: a backend: its partitioner, backend id, availability and verification method.
- ``Availability``: whether a backend can serialize here, and what to do if not.
- ``BackendUnavailableError``: raised by a plugin (its partitioner factory, lowering context or preprocess) when
  this machine lacks what the backend needs (an SDK, a library of the release it needs): the environment's fault, not
  the plugin's; the message says what to install. The same class as ``edgeplug.BackendUnavailableError``.
- ``KeepWhole``: operators the backend keeps whole through ``to_edge``.
- ``PartitionerFilter``: a per-node refinement of what the backend takes.
- ``FusionPolicy``: which core fusions run for the backend, and how.
- ``aten_rms_norm_policy``: ``aten_rms_norm_policy(backend, **fields)``, the ``FusionPolicy`` of a backend whose
  partitioner delegates ``aten.rms_norm`` (what qnn, samsung and coreml declare; keep the op whole too).
- ``Kernel``: a host implementation of a delegate op, used by verification and benchmarks.
- ``PassSpec``: a graph pass the backend runs at a stage of the pipeline.
- ``QuantScheme``: a PT2E quantizer the backend offers under a scheme name.
- ``FusionRecord``: one fusion decision, as the report shows it.
- ``TransformRecord``: one change a graph transform made, as the report shows it.
- ``hookimpl``: the marker for a plugin's hook functions (``@hookimpl``).
- ``hookspecs``: every hook, each docstring saying when it is called and what its records mean.
- ``STAND_IN_KEY``: the key of a delegate's ``_delegate_info_meta`` saying its payload is a stand-in, not
  a compiled program (``{"reason": ..., "folder": ..., "kept": ...}``): the program is then never written as runnable.

Partitioning:

- ``Verdict``: a support or filter answer: taken, or refused with a reason (falsy).
- ``TAKEN``: the ``Verdict`` that takes a node.
- ``refuse``: ``refuse(reason)`` is the refusing ``Verdict`` a filter returns.
- ``FilterContext``: what a partitioner filter sees besides the node (stage, program, constant-only nodes).
- ``SupportTablePartitioner``: a partitioner from a table of supported ops and dtypes (no vendor SDK needed).

Rewrites (passes that reshape the edge program):

- ``rewrite_pass``: the ``PassSpec`` that runs one of the core's named rewrites for a backend.
- ``apply_rewrite``: runs one of the core's named rewrites on a program in place and returns its records.
- ``NodeBuilder``: makes nodes in a program's dialect, with their fake values and metadata.
- ``replace_with_traced``: replaces a node by the graph a plain torch function traces to.
- ``note_rewrite``: the ``TransformRecord`` of a rewrite that replaced a node.
- ``PassResult``: what a pass returns with its records: ``PassResult(program, records)``.
- ``tensor_of``: the (fake) tensor a node computes, from its metadata, or None.
- ``is_static``: whether every given tensor is known and has only integer sizes.
- ``is_plain``: whether a tensor is static, contiguous and of one of the given dtypes.
- ``calls_to``: the call nodes of a program whose ``op_name`` is one of the given names.
- ``FLOATS``: the float dtypes rewrites act on by default (float32, float16).

Operators:

- ``is_qdq``: whether a target is a quantize, dequantize or choose_qparams op.
- ``aten_overload``: the aten overload an edge op wraps (an aten op is returned as is).
- ``qualified_name``: an op's schema name, e.g. ``aten::linear`` (``""`` for a non-op).
- ``op_name``: an op's short name as the report prints it, e.g. ``aten.linear.default``.

Kernels (the host-side contract the GPU plugins implement):

- ``OpCall``: one delegate op about to run on the host: what a ``Kernel.checks`` receives.
- ``GpuDevice``: the wgpu device kernels compile, upload and dispatch on.
- ``gpu_device``: the process's ``GpuDevice`` (adapter from ``EDGEPLUG_WGPU_ADAPTER``), opened on first use, then shared.
- ``KernelError``: raised when a kernel cannot run a call (bad arguments, no adapter, a shader that fails).

ExecuTorch releases (what a plugin needs of the installed ExecuTorch; declare the range you test with in your
distribution's ``Requires-Dist``, e.g. ``executorch>=1.4,<1.6``: ``edgeplug plugins`` shows it and warns outside it):

- ``executorch_feature``: ``executorch_feature(module, attr=None, *, needed_for, since=None)``, the module (or its
  attribute) if the installed ExecuTorch has it, else ``ExecutorchVersionError`` naming it, what needs it and the release
  that has it. Call it where you first need the thing (a partitioner factory), so a user on an older release is refused
  before any work with one sentence, never an ``ImportError`` blamed on edgeplug.
- ``executorch_has``: ``executorch_has(module, attr=None) -> bool``, the same probe without raising
  (for ``BackendSpec.availability``).
- ``lacks_executorch_feature``: ``lacks_executorch_feature(what, needed_for, since=None)``, the
  ``ExecutorchVersionError`` to raise when your own probe finds something missing.
- ``ExecutorchVersionError``: what ``executorch_feature`` raises (also ``edgeplug.ExecutorchVersionError``).

Runtimes (a backend's own runtime, built for this host: ``BackendSpec.device_runtime``):

- ``RuntimeNotFound``: raised by ``device_runtime()`` when no such runtime is on this machine (say how to get one).
- ``RuntimeRefusedError``: raised by a runtime's ``run`` when it refuses the program (the runtime's own message).

Importing this module is cheap: torch, executorch and wgpu load when a name
that needs them is first used.
"""

from __future__ import annotations

from typing import Optional

from edgeplug._errors import BackendUnavailableError, KernelError, RuntimeNotFound, RuntimeRefusedError
from edgeplug._hookspecs import hookimpl
from edgeplug._lazy import lazy_names
from edgeplug._records import (
    API_VERSION,
    Availability,
    BackendSpec,
    FusionPolicy,
    FusionRecord,
    KeepWhole,
    Kernel,
    PartitionerFilter,
    PassSpec,
    QuantScheme,
    TransformRecord,
    aten_rms_norm_policy,
)

# name -> (module, attribute); attribute None: the module itself
_LAZY: dict[str, tuple[str, Optional[str]]] = {
    "hookspecs": ("edgeplug._hookspecs", None),
    "STAND_IN_KEY": ("edgeplug._report.records", "STAND_IN_KEY"),
    "Verdict": ("edgeplug._partition.verdict", "Verdict"),
    "TAKEN": ("edgeplug._partition.verdict", "TAKEN"),
    "refuse": ("edgeplug._partition.verdict", "refuse"),
    "FilterContext": ("edgeplug._partition.verdict", "FilterContext"),
    "SupportTablePartitioner": ("edgeplug._partition.table", "SupportTablePartitioner"),
    "rewrite_pass": ("edgeplug._graph.canonical.table", "rewrite_pass"),
    "apply_rewrite": ("edgeplug._graph.canonical.table", "apply_rewrite"),
    "NodeBuilder": ("edgeplug._graph.rewrite", "NodeBuilder"),
    "replace_with_traced": ("edgeplug._graph.rewrite", "replace_with_traced"),
    "note_rewrite": ("edgeplug._graph.rewrite", "note_rewrite"),
    "PassResult": ("edgeplug._graph.passes", "PassResult"),
    "tensor_of": ("edgeplug._graph.rewrite", "tensor_of"),
    "is_static": ("edgeplug._graph.rewrite", "is_static"),
    "is_plain": ("edgeplug._graph.rewrite", "is_plain"),
    "calls_to": ("edgeplug._graph.rewrite", "calls_to"),
    "FLOATS": ("edgeplug._graph.canonical.base", "FLOATS"),
    "is_qdq": ("edgeplug._graph.ops", "is_qdq"),
    "aten_overload": ("edgeplug._graph.ops", "aten_overload"),
    "qualified_name": ("edgeplug._graph.ops", "qualified_name"),
    "op_name": ("edgeplug._graph.ops", "op_name"),
    "OpCall": ("edgeplug._verify.host", "OpCall"),
    "GpuDevice": ("edgeplug._runtime.device", "GpuDevice"),
    "gpu_device": ("edgeplug._runtime.process", "gpu_device"),
    "executorch_feature": ("edgeplug._executorch", "executorch_feature"),
    "executorch_has": ("edgeplug._executorch", "executorch_has"),
    "lacks_executorch_feature": ("edgeplug._executorch", "lacks_executorch_feature"),
    "ExecutorchVersionError": ("edgeplug._errors", "ExecutorchVersionError"),
}


__getattr__, __dir__ = lazy_names(
    __name__, _LAZY, " (the plugin-author surface is edgeplug.plugin.__all__; see its module docstring)"
)


__all__ = [
    "API_VERSION",
    "Availability",
    "BackendSpec",
    "BackendUnavailableError",
    "FusionPolicy",
    "FusionRecord",
    "KeepWhole",
    "Kernel",
    "PartitionerFilter",
    "PassSpec",
    "QuantScheme",
    "TransformRecord",
    "aten_rms_norm_policy",
    "hookimpl",
    "KernelError",
    "RuntimeNotFound",
    "RuntimeRefusedError",
    *_LAZY,
]
