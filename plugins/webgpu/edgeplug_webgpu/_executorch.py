"""The webgpu plugin's reaches into ExecuTorch beyond its public API (the plugin's boundary module).

- ``release_op_list``: the edge ops ExecuTorch's WebGPU runtime implements, as ExecuTorch itself lists them
  for its WebGPU test flow (``WEBGPU_SUPPORTED_OPS`` of ``executorch.backends.webgpu.test.tester``, shipped in
  the wheel beside the partitioner; the backend test suite's WebGPU flow hands it to the partitioner as its
  ``operator_allowlist``). No public API says what that runtime registers, and the runtime's C++ registry is not
  in the wheel; this list is the one ExecuTorch keeps beside its partitioner, so it moves with the release
  instead of drifting as a copy here would. Where a runtime is built here, the list its build recorded decides
  instead (``edgeplug_webgpu.runtime_ops``).
- ``vulkan_registry_ops``: the ops ``VulkanPartitioner`` can delegate at all (the keys of
  ``executorch.backends.vulkan.op_registry.vulkan_supported_ops``), from which the partitioner's allowlist for a
  built runtime's list (op names) is taken.
"""

from __future__ import annotations

import logging
from typing import Any

from edgeplug.plugin import executorch_feature

#: where ExecuTorch keeps the list (1.5.x)
RUNTIME_OPS = ("executorch.backends.webgpu.test.tester", "WEBGPU_SUPPORTED_OPS")


def release_op_list() -> list[Any]:
    """ExecuTorch's list of the edge ops its WebGPU runtime implements (edge-op objects, as its partitioner's
    ``operator_allowlist`` takes them); ``ExecutorchVersionError`` naming it where the release lacks it.

    Importing the tester module imports ExecuTorch's test harness, and with it XNNPACK's partitioner, whose
    import calls ``logging.basicConfig`` (a stderr handler on the root logger) while Vulkan's modules set the
    root logger to INFO: the root logger's level and handlers are put back as they were, so reading a list
    does not start printing ExecuTorch's logs in the caller's process."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        ops = executorch_feature(
            *RUNTIME_OPS, needed_for="the webgpu backend's support check (the ops ExecuTorch's WebGPU runtime implements)",
            since="1.5",
        )
    finally:
        root.setLevel(level)
        for h in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(h)
    return list(ops)


def vulkan_registry_ops() -> list[Any]:
    """The ops ``VulkanPartitioner`` knows (edge ops, aten and Python operators), and for each op its registry
    names by string (``"llama::sdpa_with_kv_cache"``) the custom op's default overload where it is loaded."""
    import torch

    registry = executorch_feature(
        "executorch.backends.vulkan.op_registry", "vulkan_supported_ops",
        needed_for="the webgpu backend's partitioner allowlist (the ops a built WebGPU runtime registers)",
    )
    ops: list[Any] = []
    for key in registry:
        if isinstance(key, str):
            namespace, _, name = key.partition("::")
            try:
                key = getattr(getattr(torch.ops, namespace), name).default
            except (AttributeError, RuntimeError):  # its library is not loaded: no program here holds it
                continue
        ops.append(key)
    return ops
