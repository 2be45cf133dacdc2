"""These tests verify on edgeplug's host emulation (ExecuTorch's WebGPU and Vulkan runtimes, where built, are off
for the session); modules that run programs in the WebGPU runtime use ``real_webgpu_runtime_env``. Both fixtures
are ``edgeplug_vulkan_delegate.testing``'s."""

from edgeplug_vulkan_delegate.testing import host_emulation_session, real_webgpu_runtime_env  # noqa: F401
