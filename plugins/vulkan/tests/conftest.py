"""These tests verify on edgeplug's host emulation (ExecuTorch's Vulkan runtime, where built, is off for the
session); modules that run programs in the runtime use ``real_vulkan_runtime_env``. Both fixtures are
``edgeplug_vulkan_delegate.testing``'s."""

import pytest
from edgeplug_vulkan_delegate.testing import host_emulation_session, real_vulkan_runtime_env  # noqa: F401


@pytest.fixture
def cli(edgeplug_cli):
    """``edgeplug.testing``'s ``edgeplug_cli`` (run ``edgeplug ARGS...`` in this process: exit code, stdout, stderr)."""
    return edgeplug_cli
