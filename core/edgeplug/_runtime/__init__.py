"""Host execution of lowered programs with plugin kernels on a wgpu adapter.

- ``edgeplug._runtime.device``: the wgpu device layer (adapter choice through
  ``EDGEPLUG_WGPU_ADAPTER``, cached device, pipelines and constants).
- ``edgeplug._runtime.rms_norm``: the ``et_vk.rms_norm`` contract the GPU
  plugins' kernels share (checks, launch).
- ``edgeplug._runtime.host``: ``run_lowered(result, backend)``, host
  verification of a lowered program (imports executorch).

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

from typing import Any

from edgeplug._runtime.device import ADAPTER_ENV, GpuDevice, NoAdapterError, adapter_summary, get_device, reset_device

_LAZY = {
    "run_lowered": ("edgeplug._runtime.host", "run_lowered"),
    "LoweredRun": ("edgeplug._runtime.host", "LoweredRun"),
    "OpCall": ("edgeplug._runtime.host", "OpCall"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'edgeplug._runtime' has no attribute {name!r}")


__all__ = ["ADAPTER_ENV", "GpuDevice", "NoAdapterError", "adapter_summary", "get_device", "reset_device", *_LAZY]
