"""What fusing for executorch's Vulkan delegate needs (vulkan and webgpu share it).

- ``load_et_vk_ops``: registers executorch's ``et_vk`` custom ops, so the
  core can resolve a fusion policy's ``et_vk.rms_norm`` target.
- ``without_executorch_vulkan_pattern``: keeps one of executorch's own
  Vulkan fusion patterns out of a lowering (a ``BackendSpec.lowering_context``).
- ``fusable_subgraphs_matched_once``: within a lowering, executorch's search
  for fusable Vulkan patterns runs once per graph (the partitioner and the
  core's support check both ask for the same graph).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

def load_et_vk_ops() -> None:
    """Register the ``et_vk`` ops (``torch.ops.et_vk.rms_norm``, ...)."""
    import executorch.backends.vulkan.custom_ops_lib  # noqa: F401


@contextlib.contextmanager
def without_executorch_vulkan_pattern(name: str = "rms_norm") -> Iterator[None]:
    """Keep one of executorch's own Vulkan fusion patterns out of a lowering.

    ``VulkanPartitioner`` and ``vulkan_preprocess`` fuse RMSNorm again with
    the ``"rms_norm"`` entry of executorch's pattern registry, which folds
    ``1 + w``, runtime scales, graph-input gammas and weights of shape (1,) or
    (4, D) into ``et_vk.rms_norm`` as a weight the runtime cannot prepack.
    The core has fused what is safe already (and said why it refused the
    rest); the entry is restored on exit, errors included. Nested scopes
    restore once, at the outer exit.
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
    matched already (same module, same nodes, same edges) from the first answer.

    Matching executorch's rope patterns costs seconds per graph; the
    partitioner and the core's support check ask for the same graph one after
    the other. The function is restored on exit, errors included.
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
