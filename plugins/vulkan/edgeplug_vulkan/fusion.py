"""What fusing for executorch's Vulkan delegate needs (vulkan and webgpu share it).

- ``load_et_vk_ops``: registers executorch's ``et_vk`` custom ops, so the
  core can resolve a fusion policy's ``et_vk.rms_norm`` target.
- ``without_executorch_vulkan_pattern``: keeps one of executorch's own
  Vulkan fusion patterns out of a lowering (a ``BackendSpec.lowering_context``).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

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
