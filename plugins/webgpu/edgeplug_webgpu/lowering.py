"""The scope of a lowering for this backend (``BackendSpec.lowering_context``)."""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def without_executorch_rms_norm() -> Iterator[None]:
    """Keep executorch's own Vulkan RMSNorm pattern out of this lowering.

    ``VulkanPartitioner`` and ``vulkan_preprocess`` fuse RMSNorm again with
    the ``"rms_norm"`` entry of executorch's pattern registry, which folds
    ``1 + w``, runtime scales, graph-input gammas and weights of shape (1,)
    or (4, D) into ``et_vk.rms_norm`` as a weight the runtime cannot
    prepack. The core has fused what is safe already (and said why it
    refused the rest); the entry is restored on exit, errors included.
    """
    from executorch.backends.vulkan.patterns import fusable_patterns

    entry = fusable_patterns.pop("rms_norm", None)
    try:
        yield
    finally:
        if entry is not None:
            fusable_patterns["rms_norm"] = entry
