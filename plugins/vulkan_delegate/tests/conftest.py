"""These tests verify on edgeplug's host emulation (ExecuTorch's Vulkan runtime, where built, is off for the
session); modules that run programs in the runtime use ``real_vulkan_runtime_env``. Both fixtures are
``edgeplug_vulkan_delegate.testing``'s."""

from edgeplug_vulkan_delegate.testing import host_emulation_session, real_vulkan_runtime_env  # noqa: F401
