"""The webgpu backend: the conformance suite, and executorch's own WebGPU partitioner."""

from __future__ import annotations

import edgeplug
from edgeplug.testing.conformance import *  # noqa: F401,F403

EDGEPLUG_BACKENDS = ["webgpu"]


def test_partitions_with_executorchs_webgpu_partitioner_into_vulkan_serialization():
    from executorch.backends.webgpu.partitioner import WebGPUPartitioner

    webgpu = edgeplug.get_backend("webgpu")
    assert type(webgpu.make_partitioner()) is WebGPUPartitioner
    assert webgpu.spec.backend_id == "VulkanBackend"  # WebGPU shares the Vulkan serialization
    assert webgpu.spec.verify_method == "kernels" and webgpu.availability().ok
    policy = webgpu.fusion_policy("rms_norm")
    assert policy.target == "et_vk.rms_norm" and policy.fp32_accumulation
