"""The per-node support check of a backend on the Vulkan delegate (``BackendSpec.support_check``).

executorch's ``VulkanPartitioner`` decides node by node with its
``VulkanSupportedOperators``; the check below asks the same object, built
with the partitioner's own options, and keeps the reason Vulkan states for a
refusal ("no operator implementation", "dtype not supported", ...) instead
of logging it. vulkan and webgpu share it: the WebGPU partitioner wraps a
``VulkanPartitioner``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional


def _texture_limits(options: dict, vk_utils: Any) -> Any:
    if "texture_limits" in options:
        return options["texture_limits"]
    if options.get("small_texture_limits", False):
        return vk_utils.SMALL_TEXTURE_LIMITS
    return vk_utils.DEFAULT_TEXTURE_LIMITS


def support_check(partitioner: Any, gm: Optional[Any] = None) -> Callable[[Any], Any]:
    """``check(node) -> Verdict`` for a ``VulkanPartitioner`` (or a partitioner wrapping one).

    ``gm``: the graph being partitioned, so nodes of executorch's fusable
    Vulkan patterns are judged as the partitioner judges them.
    """
    from executorch.backends.vulkan import utils as vk_utils
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanSupportedOperators

    from edgeplug.plugin import TAKEN, Verdict

    from edgeplug_vulkan_delegate._executorch import inner_vulkan_partitioner

    vk = inner_vulkan_partitioner(partitioner)
    options = vk.options
    built: list[Any] = []

    def operators() -> Any:
        # built on first use: matching executorch's fusable patterns costs as much as the
        # partitioner's own pass over the graph, and a graph with every node taken asks nothing
        if built:
            return built[0]
        fusable = []
        if gm is not None:
            import executorch.backends.vulkan.patterns as vk_patterns

            fusable = vk_patterns.get_all_fusable_subgraphs(gm)
        ops = VulkanSupportedOperators(
            _texture_limits(options, vk_utils),
            options.get("buffer_limit", vk_utils.DEFAULT_BUFFER_LIMIT),
            require_dynamic_shape=options.get("require_dynamic_shapes", False),
            skip_bool_tensors=options.get("skip_bool_tensors", False),
            operator_blocklist=vk.operator_blocklist,
            operator_allowlist=vk.operator_allowlist,
            fusable_subgraphs=fusable,
            nn_module_blocklist=vk.nn_module_blocklist,
            nn_module_allowlist=vk.nn_module_allowlist,
        )
        # log_skip is where Vulkan states its reason; keep it instead of logging it
        ops.log_skip = lambda node, reason: last.__setitem__("reason", str(reason))
        built.append(ops)
        return ops

    last: dict[str, str] = {}
    kept_aten = _aten_ops_of_edge_graph(gm)

    def check(node: Any) -> Verdict:
        last.clear()
        unregistered = _unregistered_aten_op(kept_aten.get(node))
        if unregistered:
            return Verdict(False, unregistered)
        if operators().is_node_supported({}, node):
            return TAKEN
        return Verdict(False, f"Vulkan: {last.get('reason', 'not supported')}")

    return check


def _aten_ops_of_edge_graph(gm: Optional[Any]) -> dict[Any, Any]:
    """Node -> target for the aten ops ``to_edge`` leaves in an edge graph (``aten.scalar_tensor`` of a
    symbolic size, the ``sym_size`` ops). The core shows a check every aten node as its edge op (so one
    check serves programs before decomposition too); the ``VulkanPartitioner`` sees the aten op, and
    these are the nodes where the two can differ. Empty before ``to_edge`` (every node aten there)."""
    import torch

    if gm is None:
        return {}
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    if not any(type(n.target).__name__ == "EdgeOpOverload" for n in calls):
        return {}
    return {n: n.target for n in calls if isinstance(n.target, torch._ops.OpOverload)}


def _unregistered_aten_op(target: Optional[Any]) -> str:
    """The reason ``VulkanPartitioner`` refuses an aten op of an edge graph (empty when it may take it):
    Vulkan's registry is keyed by the edge op, and executorch's ``to_edge`` keeps some ops aten on purpose
    (``aten.scalar_tensor``, which turns a symbolic size into a tensor)."""
    if target is None:
        return ""
    from executorch.backends.vulkan.op_registry import vulkan_supported_ops

    if target in vulkan_supported_ops or target.name() in vulkan_supported_ops:
        return ""
    from executorch.exir.passes.replace_aten_with_edge_pass import aten_to_edge

    try:
        edge_registered = aten_to_edge(target) in vulkan_supported_ops
    except Exception:
        edge_registered = False
    name = f"aten.{target.__name__}" if target.namespace == "aten" else str(target)
    if edge_registered:
        return (
            f"Vulkan: no operator implementation for {name} as the program holds it: executorch's to_edge "
            "keeps it an aten op (it makes a tensor of a symbolic size), and Vulkan registers only the edge op; "
            "it runs on the CPU's portable kernel"
        )
    return f"Vulkan: no operator implementation for {name}"
