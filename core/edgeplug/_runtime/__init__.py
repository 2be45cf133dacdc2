"""Host execution of lowered programs with plugin kernels on a wgpu adapter.

- ``edgeplug._runtime.device``: the wgpu device layer (adapter choice through
  ``EDGEPLUG_WGPU_ADAPTER``, ``open_device``, pipelines and constants). It
  keeps no device of its own: the process's device is cached only at the
  façade, and whoever runs a kernel passes it;
- ``edgeplug._runtime.process``: the process's one device cache (``edgeplug.plugin.gpu_device`` is it).
- host verification of a lowered program with these kernels lives in
  ``edgeplug._verify.host`` (``run_lowered``, ``OpCall``; imports executorch).

The kernel contract (``edgeplug.Kernel`` records from ``edgeplug_kernels``):
``impl(*op_args, **op_kwargs, device=GpuDevice, cache_keys={arg index: key})``
returns what the op returns (CPU tensors); ``cache_keys`` names constant
arguments by their named-data key so the device uploads each once. ``checks``
receives an ``OpCall`` (op, node, delegate, evaluated args, which args are
program constants) before dispatch and raises ``KernelError`` to refuse it,
e.g. where the backend's runtime would abort. A ``device="cpu"`` kernel's impl
takes the op's arguments only. An op's own contract (argument checks, buffer
layout, launch) belongs to the plugins that implement it.

Importing this package loads nothing (``process`` is read by ``edgeplug.plugin`` at load, and
``device`` imports numpy and torch).
"""
