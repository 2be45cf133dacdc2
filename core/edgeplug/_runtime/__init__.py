"""Host execution of lowered programs with plugin kernels on a wgpu adapter.

- ``edgeplug._runtime.device``: the wgpu device layer (adapter choice through
  ``EDGEPLUG_WGPU_ADAPTER``, cached device, pipelines and constants).
- ``edgeplug._runtime.rms_norm``: the ``et_vk.rms_norm`` contract the GPU
  plugins' kernels share (checks, launch).
- host verification of a lowered program with these kernels lives in
  ``edgeplug._verify.host`` (``run_lowered``, ``OpCall``; imports executorch).

The kernel contract (``edgeplug.Kernel`` records from ``edgeplug_kernels``):
``impl(*op_args, **op_kwargs, device=GpuDevice, cache_keys={arg index: key})``
returns what the op returns (CPU tensors); ``cache_keys`` names constant
arguments by their named-data key so the device uploads each once. ``checks``
receives an ``OpCall`` (op, node, delegate, evaluated args, which args are
program constants) before dispatch and raises ``KernelError`` to refuse it,
e.g. where the backend's runtime would abort. A ``device="cpu"`` kernel's impl
takes the op's arguments only.

Importing this package is cheap and needs neither executorch nor wgpu.
"""

from __future__ import annotations

from edgeplug._runtime.device import ADAPTER_ENV, GpuDevice, NoAdapterError, adapter_summary, get_device, reset_device

__all__ = ["ADAPTER_ENV", "GpuDevice", "NoAdapterError", "adapter_summary", "get_device", "reset_device"]
