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


def test_shares_the_vulkan_delegates_records_and_differs_only_where_it_chooses():
    """What the Vulkan delegate decides is the same for both backends; fp32 accumulation is WebGPU's kernel's own."""
    from edgeplug import FusionPolicy, KeepWhole, QuantScheme

    webgpu, vulkan = edgeplug.get_backend("webgpu"), edgeplug.get_backend("vulkan")
    assert webgpu.keep_whole == vulkan.keep_whole and webgpu.keep_whole
    # the support check is Vulkan's behind the WebGPU runtime's op list (test_runtime_ops)
    assert webgpu.spec.support_check is not None and vulkan.spec.support_check is not None
    assert webgpu.spec.lowering_context is vulkan.spec.lowering_context is not None

    def fields(record, **changed):
        return {**dict(record), "backend": "-", **changed}

    (wp,), (vp,) = webgpu.records(FusionPolicy), vulkan.records(FusionPolicy)
    assert fields(wp) == fields(vp, fp32_accumulation=True)
    assert [fields(s, factory=None) for s in webgpu.records(QuantScheme)] == [
        fields(s, factory=None) for s in vulkan.records(QuantScheme)
    ]
    assert [r.ops for r in webgpu.records(KeepWhole)] == [r.ops for r in vulkan.records(KeepWhole)]


def test_webgpu_works_without_the_vulkan_plugin():
    """webgpu needs edgeplug-vulkan-delegate, not edgeplug-vulkan: with the vulkan plugin unimportable it resolves and runs its kernel."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import sys
        sys.modules["edgeplug_vulkan"] = None  # any import of the vulkan plugin now fails
        import torch
        import edgeplug
        webgpu = edgeplug.get_backend("webgpu")
        assert webgpu.spec.backend_id == "VulkanBackend" and webgpu.fusion_policy("rms_norm").target == "et_vk.rms_norm"
        y = webgpu.kernel("et_vk.rms_norm.default").impl(torch.ones(2, 4), torch.full((4,), 2.0), 0.0)
        torch.testing.assert_close(y, torch.full((2, 4), 2.0))
        assert "vulkan" not in edgeplug.backends()  # its plugin failed to import, and only it
        assert not any(m == "edgeplug_vulkan" or m.startswith("edgeplug_vulkan.") for m in sys.modules if sys.modules[m] is not None)
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
