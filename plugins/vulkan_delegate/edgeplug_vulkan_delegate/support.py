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

    vk = getattr(partitioner, "_vulkan_partitioner", partitioner)
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

    def check(node: Any) -> Verdict:
        last.clear()
        if operators().is_node_supported({}, node):
            return TAKEN
        return Verdict(False, f"Vulkan: {last.get('reason', 'not supported')}")

    return check
