"""The QNN backend's partitioner filters.

``constant_only``: HTP's constant-only rule. The HTP refuses a graph that
reads no runtime input, so what is computed only from weights runs on the
CPU. An op QNN keeps whole (``linear``, ``hardswish``, ``rms_norm``, ...)
whose inputs are all constant-only must therefore be decomposed into ops the
CPU runs. Quantize and dequantize ops are the exception: QNN builds its
weight encodings (per-channel, per-block) from them, so they stay whole even
when they read only constants, and are delegated with the runtime op that
consumes them. What comes after a constant-only dequantize is still
constant-only (the analysis propagates through it), so a ``linear`` over a
dequantized table is decomposed.

``rms_norm_one_axis``: QNN's RmsNorm op builder normalises the last axis
only; given an ``aten.rms_norm`` whose ``normalized_shape`` spans more axes
it warns and builds nothing, so such a node must not be kept whole or
delegated. Refused, it is decomposed into the elementwise ops and the mean
it is made of, which QNN takes one by one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:  # the partition module imports executorch; plugins load without it
    from edgeplug.plugin import FilterContext

NAME = "htp-constant-only"
RMS_NORM_NAME = "qnn-rms-norm-last-axis-only"


def constant_only(node: Any, ctx: "FilterContext") -> Optional[bool]:
    """False for a constant-only op, True for a constant-only quantize/dequantize."""
    if not ctx.is_constant_only(node):
        return None
    from edgeplug.plugin import is_qdq

    return is_qdq(node.target)


def rms_norm_one_axis(node: Any, ctx: "FilterContext") -> Optional[bool]:
    """False for an ``aten.rms_norm`` (aten or edge dialect) normalising over more than one axis."""
    from edgeplug.plugin import qualified_name

    if node.op != "call_function" or qualified_name(node.target) != "aten::rms_norm":
        return None
    shape = node.args[1] if len(node.args) > 1 else node.kwargs.get("normalized_shape")
    if shape is None or len(shape) <= 1:
        return None
    return False
