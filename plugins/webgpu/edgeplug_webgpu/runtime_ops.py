"""What ExecuTorch's WebGPU runtime implements, as the webgpu backend's support check sees it.

The WebGPU runtime is its own program (``backends/webgpu/runtime``): it reads the Vulkan delegate's
serialization but registers a smaller set of operators than the Vulkan runtime. ``VulkanPartitioner``
(which ``WebGPUPartitioner`` wraps) knows only the Vulkan runtime's, so, left alone, it delegates ops
the WebGPU runtime would refuse when it loads the program. The backend therefore:

- builds its partitioner as ExecuTorch's own WebGPU flow does: the runtime's op list as the
  ``operator_allowlist`` and bool tensors left on the CPU (``partitioner_options``);
- refuses every other op in its support check (``support_check``, the first part of the core's one
  predicate), so an op outside the list is neither kept whole nor delegated, and the report says why.

The list is ExecuTorch's (``edgeplug_webgpu._executorch.runtime_op_list``), read once per process.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional


@functools.lru_cache(maxsize=1)
def runtime_op_names() -> frozenset[str]:
    """The names (``op_name``: ``"aten.add.Tensor"``) of the ops ExecuTorch's WebGPU runtime implements."""
    from edgeplug.plugin import op_name

    from edgeplug_webgpu._executorch import runtime_op_list

    return frozenset(op_name(op) for op in runtime_op_list())


def partitioner_options() -> tuple[dict[str, Any], list[Any]]:
    """``WebGPUPartitioner``'s compile options and operator allowlist, as ExecuTorch's WebGPU test flow gives them:
    bool tensors left on the CPU, and only the ops the runtime implements."""
    from edgeplug_webgpu._executorch import runtime_op_list

    return {"skip_bool_tensors": True}, runtime_op_list()


def support_check(partitioner: Any, gm: Optional[Any] = None) -> Callable[[Any], Any]:
    """The webgpu backend's ``BackendSpec.support_check``: an op outside the WebGPU runtime's list is refused,
    saying so; any other node is judged by the Vulkan delegate's check (``edgeplug_vulkan_delegate.support``)."""
    from edgeplug.plugin import op_name, qualified_name, refuse

    from edgeplug_vulkan_delegate.support import support_check as vulkan_support_check

    vulkan = vulkan_support_check(partitioner, gm)
    implemented = runtime_op_names()

    def check(node: Any) -> Any:
        if node.op == "call_function" and qualified_name(node.target):  # an op, not getitem or a higher-order op
            name = op_name(node.target)
            if name not in implemented:
                return refuse(
                    f"ExecuTorch's WebGPU runtime does not implement {name} (not in ExecuTorch's list of the ops that "
                    "runtime implements, WEBGPU_SUPPORTED_OPS of executorch.backends.webgpu.test.tester)"
                )
        return vulkan(node)

    return check
