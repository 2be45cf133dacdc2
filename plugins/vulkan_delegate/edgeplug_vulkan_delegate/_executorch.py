"""Every reach of the Vulkan delegate family into executorch's internals: the family's boundary module.

Each is a named function; the core's ``tests/test_executorch_boundary.py`` fails on a reach anywhere else in
the family. Patches of executorch's Vulkan internals are each restored on exit (errors included).

A lowering for a backend on the Vulkan delegate runs inside ``lowering_context``
(the ``BackendSpec.lowering_context`` of vulkan and webgpu), which applies the
three patches below and nothing else; no other module of the family writes to
executorch. Each patch says what upstream does, why that is wrong or costly
for edgeplug, and what it changes:

- ``without_executorch_vulkan_pattern``: executorch's own RMSNorm fusion is
  taken out of its pattern registry for the lowering.
- ``fusable_subgraphs_matched_once``: executorch's search for fusable Vulkan
  patterns answers a graph it has searched from its first answer.
- ``pattern_graphs_traced_once``: executorch's pattern graphs (the RoPE
  patterns, traced by export and to_edge) are traced once per process.

Seen with executorch 1.5.1; when upstream changes one of these behaviours, the patch
that works around it goes, and the tests in ``plugins/vulkan_delegate/tests``
say which.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


@contextlib.contextmanager
def without_executorch_vulkan_pattern(name: str = "rms_norm") -> Iterator[None]:
    """Keep one of executorch's own Vulkan fusion patterns out of a lowering.

    Upstream: ``VulkanPartitioner`` and ``vulkan_preprocess`` fuse RMSNorm
    again with the ``"rms_norm"`` entry of
    ``executorch.backends.vulkan.patterns.fusable_patterns``, whose guards
    take ``1 + w``, runtime scales, graph-input gammas and weights of shape
    (1,) or (4, D) as ``et_vk.rms_norm``'s weight, which the runtime prepacks
    at load time and cannot take from a runtime value.
    Why: the core has fused what is safe already and said why it refused the
    rest; a second fusion downstream would undo those refusals.
    Patch: the entry is popped from the registry for the block and put back
    on exit, errors included; nested scopes restore once, at the outer exit.
    """
    from executorch.backends.vulkan.patterns import fusable_patterns

    entry = fusable_patterns.pop(name, None)
    try:
        yield
    finally:
        if entry is not None:
            fusable_patterns[name] = entry


def _structure(gm: Any) -> tuple:
    """What pattern matching reads of a graph: each node's name, op, target and inputs."""
    return tuple(
        (n.name, n.op, str(n.target), tuple(a.name for a in n.all_input_nodes)) for n in gm.graph.nodes
    )


@contextlib.contextmanager
def fusable_subgraphs_matched_once() -> Iterator[None]:
    """Within the block, executorch's ``get_all_fusable_subgraphs`` answers a graph it has
    searched already (same module, same nodes, same edges) from its first answer.

    Upstream: ``executorch.backends.vulkan.patterns.get_all_fusable_subgraphs``
    matches every registered pattern against the whole graph on each call;
    matching the rope patterns costs seconds per graph.
    Why: the partitioner and the family's support check (``support.py``) ask
    for the same graph one after the other, so each lowering paid it twice.
    Patch: the module attribute is replaced by a memo of the original for the
    block (a changed graph is searched again) and put back on exit, errors included.
    """
    import executorch.backends.vulkan.patterns as vk_patterns

    match = vk_patterns.get_all_fusable_subgraphs
    seen: dict[int, tuple[Any, tuple, Any]] = {}

    def once(graph_module: Any) -> Any:
        key = _structure(graph_module)
        hit = seen.get(id(graph_module))
        if hit is not None and hit[0] is graph_module and hit[1] == key:
            return hit[2]
        found = match(graph_module)
        seen[id(graph_module)] = (graph_module, key, found)
        return found

    vk_patterns.get_all_fusable_subgraphs = once
    try:
        yield
    finally:
        vk_patterns.get_all_fusable_subgraphs = match


#: get_graphs_fn -> the graphs it returned: the pattern graphs, traced once per process (``pattern_graphs_traced_once``)
_PATTERN_GRAPHS: dict[Any, list] = {}


@contextlib.contextmanager
def pattern_graphs_traced_once() -> Iterator[None]:
    """Within the block, each pattern graph function of executorch's Vulkan pattern registry runs once per
    process; a later call returns the graphs of the first.

    Upstream: the registry's RoPE entries (``rope.get_rope_graphs``, ``rope_hf.get_hf_rope_graphs``) build their
    pattern graphs by ``torch.export`` and ``to_edge`` of small modules, on every call: their ``lru_cache`` wraps
    the function after ``register_pattern_graph`` registered it, so the registry holds the uncached one. Every
    partitioning and every preprocess (``FusePatternsPass``) traces them again: 3 graphs, 8 to 13 s a call on
    this loaded 2-core machine, whatever the program (most of a small program's lowering; docs/benchmarks.md).
    Why: the graphs depend on nothing but those modules (fixed shapes, float32) and are only read (matched
    against with ``SubgraphMatcher``); a lowering that partitions twice (``copy_shared_constants``' trial
    partition) paid for them three times.
    Patch: each entry's ``get_graphs_fn`` is replaced by a memo of the original for the block (the cache outlives
    it: keyed by the original function, so a re-registered pattern is traced anew) and put back on exit, errors
    included; callers get a new list each time (they extend it), holding the same graphs.
    """
    from executorch.backends.vulkan.patterns import fusable_patterns

    def once(fn: Any) -> Any:
        def graphs() -> list:
            if fn not in _PATTERN_GRAPHS:
                _PATTERN_GRAPHS[fn] = list(fn())
            return list(_PATTERN_GRAPHS[fn])

        graphs.__wrapped__ = fn  # type: ignore[attr-defined]
        return graphs

    replaced = {
        name: entry.get_graphs_fn for name, entry in fusable_patterns.items()
        if entry.get_graphs_fn is not None and not hasattr(entry.get_graphs_fn, "__wrapped__")
    }
    for name, fn in replaced.items():
        fusable_patterns[name].get_graphs_fn = once(fn)
    try:
        yield
    finally:
        for name, fn in replaced.items():
            if name in fusable_patterns:
                fusable_patterns[name].get_graphs_fn = fn


def inner_vulkan_partitioner(partitioner: Any) -> Any:
    """The ``VulkanPartitioner`` a partitioner wraps (WebGPU's keeps one in a private attribute), or itself."""
    return getattr(partitioner, "_vulkan_partitioner", partitioner)


@contextlib.contextmanager
def lowering_context() -> Iterator[None]:
    """The patches for one lowering (``BackendSpec.lowering_context``), undone in reverse on exit."""
    with without_executorch_vulkan_pattern("rms_norm"), fusable_subgraphs_matched_once(), pattern_graphs_traced_once():
        yield
