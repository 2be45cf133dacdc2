"""Every edgeplug hook, in one place.

A plugin is a module with functions decorated ``@edgeplug.hookimpl`` whose
names are the hooks below. Each hook takes no arguments and returns an
iterable of records (imported from ``edgeplug.plugin``, the one module a plugin
imports); every record names the backend it is for. The plugin manager calls each plugin's implementation on its own, so
a plugin that raises is reported without hiding the others.

Hooks, in the order the lowering pipeline uses them:

1. registration: ``edgeplug_backends``
2. export: ``edgeplug_passes`` (stage "export")
3. to_edge: ``edgeplug_keep_whole``, ``edgeplug_partitioner_filters``
4. edge: ``edgeplug_passes`` (stage "edge"), ``edgeplug_fusion_policies``, then
   ``edgeplug_passes`` (stage "pre_partition")
5. verification and benchmarks: ``edgeplug_kernels``
6. quantization (``edgeplug.quantize``, ``lower --quantize``): ``edgeplug_quantizers``

A module-level function whose name starts with ``edgeplug_`` but lacks the
``@edgeplug.hookimpl`` marker, or names no hook, is reported when the plugin
loads (the plugin is dropped), as pytest reports a misspelt ``pytest_`` hook.

The author's guide, docs/writing-a-backend.md, shows each hook with an example.
"""

from __future__ import annotations

from typing import Iterable

import pluggy

from edgeplug._records import (
    BackendSpec,
    FusionPolicy,
    KeepWhole,
    Kernel,
    PartitionerFilter,
    PassSpec,
    QuantScheme,
)

PROJECT = "edgeplug"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def edgeplug_backends() -> Iterable[BackendSpec]:
    """Register backends.

    Called once when plugins load. Yield one ``BackendSpec`` per backend this
    plugin adds. Two specs with one name (from any plugins) are an error.
    """


@hookspec
def edgeplug_keep_whole() -> Iterable[KeepWhole]:
    """Operators a backend keeps whole through ``to_edge`` (not decomposed).

    Called once when plugins load. Entries must be ``OpOverload`` objects
    (``torch.ops.aten.linear.default``). The core partitioner keeps an op whole
    only where the backend's support check and filters say the node will be
    delegated, so a kept-whole op is never left on the CPU.
    """


@hookspec
def edgeplug_partitioner_filters() -> Iterable[PartitionerFilter]:
    """Per-node refinements of the one keep-whole/partition predicate.

    Called when a backend is resolved; the core partitioner asks every filter
    of the backend, for each candidate node, at stage "before_decomposition"
    (aten graph: keep this kept-whole op whole?) and "partition" (edge graph:
    delegate this node?). ``fn(node, ctx)`` returns:

    - ``False``: refuse the node (it is decomposed / left on the CPU, and the
      report names the filter as the reason); ``edgeplug.plugin.refuse(why)``
      (a falsy ``Verdict``) refuses with the filter's own reason, reported as
      "refused by filter 'name': why";
    - ``True``: accept it; this overrides only the backend's constant-only
      policy (e.g. a weight dequantize HTP needs whole), never its support
      check;
    - ``None``: no opinion.

    ``ctx`` is an ``edgeplug.plugin.FilterContext``: ``ctx.stage``,
    ``ctx.ep`` and ``ctx.is_constant_only(node)``. At "partition" a filter
    is asked about the nodes the backend's partitioner took; the core then
    forms the partitions from the accepted nodes, so a refusal never makes a
    partition invalid, whatever the partitioner. Filters never silence the
    post-lowering check: a kept-whole op left on the CPU is always reported.
    """


@hookspec
def edgeplug_fusion_policies() -> Iterable[FusionPolicy]:
    """How a backend wants core pattern matches (rms_norm) fused.

    Called once when plugins load. At most one policy per backend and
    pattern, across all plugins (a second one makes the backend unavailable,
    naming both distributions). No policy: the pattern is not fused for the
    backend. ``edgeplug.plugin.aten_rms_norm_policy(backend)`` is the policy of a backend whose
    partitioner delegates ``aten.rms_norm``.
    """


@hookspec
def edgeplug_kernels() -> Iterable[Kernel]:
    """Runtime kernels for ops a backend's delegates compute.

    Used by host verification and the benchmarks. ``Kernel.op`` is written
    ``namespace.name.overload`` and resolved against torch's op registry at
    load. Two kernels for one op and device of one backend make the backend
    unavailable, naming both distributions.
    """


@hookspec
def edgeplug_passes() -> Iterable[PassSpec]:
    """Backend passes: stage "export" (aten IR), "edge" (before the core's fusion) or
    "pre_partition" (after it, before partitioning).

    Run by the core's pass runner, which reserves node names first and lints
    the graph after each pass. Order: every ``before``/``after`` constraint
    holds (pass names of the same backend and stage, from any plugin);
    ``order`` breaks ties. A pass name used twice for one backend, a
    constraint naming no pass, or a cycle makes the backend unavailable with
    a message naming the plugins.
    """


@hookspec
def edgeplug_quantizers() -> Iterable[QuantScheme]:
    """Quantization schemes of a backend, for ``edgeplug.quantize`` and ``lower --quantize``.

    Called once when plugins load. Yield one ``QuantScheme`` per scheme
    (``"8a8w"``, ``"w4"``, ...) with a factory that builds the backend's own
    torchao ``Quantizer`` (``kind="pt2e"``) or the torchao config that
    ``quantize_`` applies to the model (``kind="source_transform"``); the factory is called only when that scheme is used,
    and must never reach the network. A backend with no scheme cannot be
    quantized for (the error lists the backends that can); two schemes of one
    name for one backend are an error naming both distributions.
    """
