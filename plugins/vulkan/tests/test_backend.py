"""The vulkan backend: the conformance suite, and executorch's own Vulkan partitioner."""

from __future__ import annotations

import edgeplug
from edgeplug.testing.conformance import *  # noqa: F401,F403

EDGEPLUG_BACKENDS = ["vulkan"]


def test_partitions_with_executorchs_vulkan_partitioner_and_verifies_with_kernels():
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    vulkan = edgeplug.get_backend("vulkan")
    assert type(vulkan.make_partitioner()) is VulkanPartitioner
    assert vulkan.spec.backend_id == "VulkanBackend"
    assert vulkan.spec.verify_method == "kernels" and vulkan.availability().ok
    assert vulkan.fusion_policy("rms_norm").target == "et_vk.rms_norm"
