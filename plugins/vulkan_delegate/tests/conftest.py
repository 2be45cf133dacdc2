"""These tests verify on edgeplug's host emulation (ExecuTorch's Vulkan runtime, where built, is off for the
session); modules that run programs in the runtime use ``real_vulkan_runtime_env``. Both fixtures are
``edgeplug_vulkan_delegate.testing``'s."""

import pytest

from edgeplug_vulkan_delegate.testing import host_emulation_session, real_vulkan_runtime_env  # noqa: F401


@pytest.fixture
def owning_delegate_backend():
    """webgpu as a backend whose runtime kept a buffer moved into its delegate (``testing.owning_buffers``)."""
    import edgeplug
    from edgeplug_vulkan_delegate.testing import owning_buffers

    pytest.importorskip("edgeplug_webgpu")
    return owning_buffers(edgeplug.get_backend("webgpu"))
