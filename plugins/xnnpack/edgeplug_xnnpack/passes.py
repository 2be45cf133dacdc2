"""The xnnpack backend's pass: a division by a power of two becomes a multiply.

``x / 4.0`` and ``x * 0.25`` are bitwise equal for every float (a power of
two has an exact reciprocal), and XNNPACK's multiply is cheaper than its
divide. Any other divisor is left alone: ``x / 3.0`` and ``x * (1 / 3.0)``
differ in the last bit.
"""

from __future__ import annotations

import math
from typing import Any

NAME = "div_by_power_of_two_to_mul"


def _power_of_two(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value == 0 or not math.isfinite(value):
        return False
    mantissa, exponent = math.frexp(abs(value))
    # the reciprocal of 2**k must be a normal float32 as well (float32 programs)
    return mantissa == 0.5 and -125 <= exponent - 1 <= 126


def div_by_power_of_two_to_mul(ep: Any) -> None:
    """Export stage (aten IR): rewrite ``aten.div.Tensor(x, c)`` with ``c`` a power of two; changes ``ep`` in place."""
    import torch

    div, mul = torch.ops.aten.div.Tensor, torch.ops.aten.mul.Tensor
    for node in ep.graph.nodes:
        if node.op != "call_function" or node.target is not div or node.kwargs:
            continue
        x, divisor = node.args
        val = getattr(x, "meta", {}).get("val")
        if not _power_of_two(divisor) or not (isinstance(val, torch.Tensor) and val.dtype.is_floating_point):
            continue
        node.target = mul
        node.args = (x, 1.0 / divisor)
    ep.graph.lint()
