"""HTP's constant-only rule, as a partitioner filter.

The HTP refuses a graph that reads no runtime input, so what is computed only
from weights runs on the CPU. An op QNN keeps whole (``linear``,
``hardswish``, ``rms_norm``, ...) whose inputs are all constant-only must
therefore be decomposed into ops the CPU runs. Quantize and dequantize ops
are the exception: QNN builds its weight encodings (per-channel, per-block)
from them, so they stay whole even when they read only constants, and are
delegated with the runtime op that consumes them. What comes after a
constant-only dequantize is still constant-only (the analysis propagates
through it), so a ``linear`` over a dequantized table is decomposed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:  # the partition module imports executorch; plugins load without it
    from edgeplug.partition import FilterContext

NAME = "htp-constant-only"


def constant_only(node: Any, ctx: "FilterContext") -> Optional[bool]:
    """False for a constant-only op, True for a constant-only quantize/dequantize."""
    if not ctx.is_constant_only(node):
        return None
    from edgeplug.partition import is_quantize_op

    return is_quantize_op(node.target)
