"""These tests verify on edgeplug's host emulation (ExecuTorch's WebGPU and Vulkan runtimes, where built, are off
for the session); modules that run programs in the WebGPU runtime use ``real_webgpu_runtime_env``. Both fixtures
are ``edgeplug_vulkan_delegate.testing``'s."""

from edgeplug_vulkan_delegate.testing import host_emulation_session, real_webgpu_runtime_env  # noqa: F401


def pytest_runtest_setup(item):
    """On an ExecuTorch release without WebGPUPartitioner (1.4) every webgpu lowering is refused before any work:
    the tests here skip, saying so, but for test_executorch_release.py, which checks that refusal."""
    import pytest

    from edgeplug.plugin import executorch_has

    if item.path.name != "test_executorch_release.py" and not executorch_has(
        "executorch.backends.webgpu.partitioner", "WebGPUPartitioner"
    ):
        pytest.skip("this ExecuTorch release has no WebGPUPartitioner (new in 1.5): webgpu is refused here")
