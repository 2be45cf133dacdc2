"""webgpu delegates only what ExecuTorch's WebGPU runtime implements (issue 49).

``VulkanPartitioner``, which ``WebGPUPartitioner`` wraps, knows the Vulkan runtime's ops; the WebGPU runtime
registers fewer. ExecuTorch's own WebGPU flow hands its partitioner the runtime's list; so does the backend, and
its support check (the first part of the core's one predicate) refuses the rest with that reason.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import edgeplug


class Mixed(torch.nn.Module):
    """relu and gelu: Vulkan has shaders for both, the WebGPU runtime for neither; sigmoid, mul, add: both."""

    def forward(self, x):
        return torch.nn.functional.gelu(torch.relu(x)) * torch.sigmoid(x) + x


@pytest.fixture(scope="module")
def webgpu_ops():
    from executorch.backends.webgpu.test.tester import WEBGPU_SUPPORTED_OPS

    from edgeplug.plugin import op_name

    return {op_name(op) for op in WEBGPU_SUPPORTED_OPS}


def test_delegates_only_the_ops_the_webgpu_runtime_implements(webgpu_ops):
    report = edgeplug.lower(Mixed(), (torch.randn(2, 8),), "webgpu", dry_run=True).report
    assert set(report.delegated_ops) == {"aten.sigmoid.default", "aten.mul.Tensor", "aten.add.Tensor"}
    assert set(report.delegated_ops) <= webgpu_ops
    reasons = {c.op: c.reason for c in report.cpu_nodes}
    assert set(reasons) == {"aten.relu.default", "aten.gelu.default"}
    for op, reason in reasons.items():
        assert f"ExecuTorch's WebGPU runtime does not implement {op}" in reason


def test_vulkan_still_delegates_what_its_runtime_implements():
    """The list is webgpu's own: the vulkan backend, on the same delegate, takes relu and gelu."""
    report = edgeplug.lower(Mixed(), (torch.randn(2, 8),), "vulkan", dry_run=True).report
    assert {"aten.relu.default", "aten.gelu.default"} <= set(report.delegated_ops)


def test_a_kept_whole_op_outside_the_list_is_decomposed_not_stranded(webgpu_ops):
    """upsample_nearest2d is kept whole for the Vulkan delegate; the WebGPU runtime lacks it, so it is decomposed."""

    class Up(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.interpolate(x, scale_factor=2, mode="nearest") + 1

    result = edgeplug.lower(Up(), (torch.randn(1, 2, 4, 4),), "webgpu", dry_run=True)
    assert "aten.upsample_nearest2d.vec" not in webgpu_ops
    assert "aten.upsample_nearest2d.vec" not in result.report.delegated_ops
    (decomposed,) = [c for c in result.report.decomposed_instead if c.op == "aten.upsample_nearest2d.vec"]
    assert "ExecuTorch's WebGPU runtime does not implement aten.upsample_nearest2d.vec" in decomposed.reason
    assert set(result.report.delegated_ops) <= webgpu_ops


def test_reading_the_list_leaves_the_callers_logging_as_it_was():
    """ExecuTorch's tester module is imported to read the list; its imports configure the root logger."""
    code = textwrap.dedent(
        """
        import logging
        root = logging.getLogger()
        before = (root.level, list(root.handlers))
        from edgeplug_webgpu.runtime_ops import release_list
        names = release_list("no runtime build in this test").names
        assert "aten.add.Tensor" in names and "aten.relu.default" not in names
        assert (root.level, list(root.handlers)) == before, (root.level, root.handlers)
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
