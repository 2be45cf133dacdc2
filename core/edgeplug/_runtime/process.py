"""The process's GPU device: the one ``DeviceCache``, opened on first use and then shared.

Like the default plugin manager in ``edgeplug._registry.lookup``, this is the one
piece of process state of its kind, and it sits beside the façades:
``edgeplug.plugin.gpu_device`` (backend authors) is this function, and host
verification and the CLI read it here, so no core module imports the author
surface. Everything below takes the device it is given.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from edgeplug._runtime.device import GpuDevice

#: the process's devices (edgeplug._runtime.device.DeviceCache), made on the first gpu_device call
_cache: Any = None
_cache_made = threading.Lock()


def gpu_device(adapter: Optional[str] = None) -> GpuDevice:
    """The process's ``GpuDevice`` on ``adapter`` (None: ``EDGEPLUG_WGPU_ADAPTER``), opened on first use, then shared.

    The one process-wide cache of a device: kernels and host verification take
    the device they are given and default to this one. Raises ``NoAdapterError``
    (a ``KernelError``) saying why there is no adapter; the answer, device or
    failure, is kept per adapter choice, so setting the variable reaches another device.
    """
    global _cache
    with _cache_made:
        if _cache is None:
            # numpy and torch (via _runtime.device): paid on the first device, not by whoever imports the façade
            from edgeplug._runtime.device import DeviceCache

            _cache = DeviceCache()
    return _cache.get(adapter)
