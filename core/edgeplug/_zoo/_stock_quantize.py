"""What a quantized cell adds: stock's quantization with the same quantizer, and the .pte files' timing.

A quantized cell's stock side quantizes as a user of executorch alone does
(``quantize_stock``); where the backend's programs run here, both .pte files
are timed in executorch's runtime, alternately, on one thread (``time_ptes``).
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch

from edgeplug import _executorch
from edgeplug._zoo._lowering import first_line


class StageError(Exception):
    """A stock quantization flow stopped at ``stage``: the first line of what it raised."""

    def __init__(self, stage: str, exc: BaseException) -> None:
        super().__init__(first_line(exc))
        self.stage = stage


def quantize_stock(module: torch.nn.Module, args: tuple, kwargs: dict, record: Any) -> Any:
    """What a user of executorch alone runs for the quantizer of ``record`` (a QuantScheme): the program to lower.

    ``pt2e``: ``torch.export``, ``prepare_pt2e`` with the same quantizer, one calibration call on the example
    inputs, ``convert_pt2e``, export again. ``source_transform``: torchao's ``quantize_`` with the same
    config(s) on a copy, then ``torch.export``. Nothing is folded or rewritten first. Raises StageError."""
    stage = "export"
    try:
        if record.kind == "pt2e":
            # torchao: only a cell's process quantizes; the zoo's parent imports this module
            from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

            with torch.no_grad():
                ep = torch.export.export(module, args, kwargs or None)
                stage = "prepare_pt2e"
                prepared = prepare_pt2e(ep.module(), record.factory())
                stage = "calibrate"
                prepared(*args, **kwargs)
                stage = "convert_pt2e"
                converted = convert_pt2e(prepared)
                stage = "export"
                return torch.export.export(converted, args, kwargs or None)
        # torchao: as above
        from torchao.quantization import quantize_

        stage = "quantize_"
        made = record.factory()
        steps = list(made) if isinstance(made, (list, tuple)) else [(made, None)]
        copied = copy.deepcopy(module)
        with torch.no_grad():
            for config, keep in steps:
                quantize_(copied, config, filter_fn=keep)
            stage = "export"
            return torch.export.export(copied, args, kwargs or None)
    except Exception as exc:
        raise StageError(stage, exc) from exc


def time_ptes(buffers: dict[str, bytes], inputs: list, rounds: int = 15, calls: int = 20) -> dict[str, float]:
    """Median forward time (ms) of each serialized program in executorch's runtime, on one thread.

    Every round times ``calls`` forwards of each program, the sides alternating (the first side changes
    from round to round), after three warm-up calls each; the median over rounds is kept."""
    _executorch.set_runtime_threads(1)  # one thread: the figure is the program's, not the machine's
    modules = {name: _executorch.load_pte(b) for name, b in buffers.items()}
    for m in modules.values():
        for _ in range(3):
            m.forward(list(inputs))
    times: dict[str, list[float]] = {name: [] for name in modules}
    order = list(modules)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            m = modules[name]
            t = time.perf_counter()
            for _ in range(calls):
                m.forward(list(inputs))
            times[name].append((time.perf_counter() - t) * 1000 / calls)
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}
