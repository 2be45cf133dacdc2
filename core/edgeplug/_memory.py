"""Peak resident memory per lowering stage (``lower(..., profile_memory=True)``, ``--profile-memory``).

Linux keeps a process's resident high-water mark (``VmHWM`` in ``/proc/self/status``)
and lets the process reset it (``echo 5 > /proc/self/clear_refs``): a stage's
peak is read exactly, at no cost while the stage runs. Where the reset is not
allowed, a thread samples the resident size every ``SAMPLE_SECONDS`` instead
(a peak shorter than that may be missed). tracemalloc sees only Python's own
allocations and slows a large lowering several times over, so it is not used.

The reset also resets what ``getrusage``'s ``ru_maxrss`` reports for this
process: ``StageMemory.peak_mib`` is the whole profile's peak.
"""

from __future__ import annotations

import re
import threading
from typing import Optional

from edgeplug._errors import EdgeplugError

#: how often the fallback sampler reads the resident size
SAMPLE_SECONDS = 0.005

_MIB = 1024 * 1024


def _status_mib(field: str) -> Optional[float]:
    try:
        with open("/proc/self/status") as f:
            text = f.read()
    except OSError:
        return None
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) / 1024 if m else None


def rss_mib() -> Optional[float]:
    """This process's resident set now, in MiB (None where /proc is absent)."""
    return _status_mib("VmRSS")


def _reset_high_water_mark() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class _Sampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(name="edgeplug-rss-sampler", daemon=True)
        self.peak = rss_mib() or 0.0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(SAMPLE_SECONDS):
            now = rss_mib()
            if now is not None and now > self.peak:
                self.peak = now

    def stop(self) -> float:
        self.done.set()
        self.join()
        return max(self.peak, rss_mib() or 0.0)


class StageMemory:
    """Peak resident MiB of one stage at a time: ``start()`` when a stage begins, ``stop()`` when it ends."""

    def __init__(self) -> None:
        if rss_mib() is None:
            raise EdgeplugError(
                "profiling memory needs Linux's /proc/self/status (the resident set size), which this system "
                "does not have; lower without profile_memory (--profile-memory)"
            )
        self.method = "high-water mark" if _reset_high_water_mark() else "sampling"
        self.peak_mib = 0.0
        self._sampler: Optional[_Sampler] = None

    def start(self) -> None:
        if self.method == "high-water mark":
            _reset_high_water_mark()
        else:
            self._sampler = _Sampler()
            self._sampler.start()

    def stop(self) -> float:
        """The stage's peak resident MiB (the whole process, libraries and the model included)."""
        if self._sampler is not None:
            peak, self._sampler = self._sampler.stop(), None
        else:
            peak = _status_mib("VmHWM") or 0.0
        self.peak_mib = max(self.peak_mib, peak)
        return peak
