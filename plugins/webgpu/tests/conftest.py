"""These tests verify on edgeplug's host emulation (ExecuTorch's WebGPU and Vulkan runtimes, where built, are off
for the session); modules that run programs in the WebGPU runtime use ``real_webgpu_runtime_env``. Both fixtures
are ``edgeplug_vulkan_delegate.testing``'s. ``runtime`` is ExecuTorch's WebGPU runtime where one is built, else the
test skips saying how to build one."""

import pytest

from edgeplug.plugin import RuntimeNotFound

from edgeplug_vulkan_delegate.runtime import webgpu_device_runtime
from edgeplug_vulkan_delegate.testing import host_emulation_session, real_webgpu_runtime_env  # noqa: F401


@pytest.fixture(scope="module")
def runtime(request):
    request.getfixturevalue("real_webgpu_runtime_env")  # the runner variable as the shell set it
    try:
        return webgpu_device_runtime()
    except RuntimeNotFound as exc:
        pytest.skip(f"{exc} (`make webgpu-runtime` builds one and runs these)")


def pytest_runtest_setup(item):
    """On an ExecuTorch release without WebGPUPartitioner (1.4) every webgpu lowering is refused before any work:
    the tests here skip, saying so, but for test_executorch_release.py, which checks that refusal."""
    from edgeplug.plugin import executorch_has

    if item.path.name != "test_executorch_release.py" and not executorch_has(
        "executorch.backends.webgpu.partitioner", "WebGPUPartitioner"
    ):
        pytest.skip("this ExecuTorch release has no WebGPUPartitioner (new in 1.5): webgpu is refused here")
