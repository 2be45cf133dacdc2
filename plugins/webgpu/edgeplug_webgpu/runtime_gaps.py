"""What ExecuTorch's WebGPU runtime refuses among the ops it lists, found by running edgeplug's programs in it
(tools/webgpu-runtime, docs/benchmarks.md "ExecuTorch's WebGPU runtime"). A partitioner filter keeps each such
node on the CPU, with its reason in the report; the op list itself is ``runtime_ops``'s.

- A dtype conversion (``_to_copy``, ``_to_dim_order_copy``) between two float widths: the runtime (cff6f4d,
  ``ops/to_copy/ToCopy.cpp``) copies bytes when both ends have one kind and width, turns bool into float32,
  and sends everything else to its int<->float converter, which takes 32-bit ends only; float32 <-> float16
  therefore fails at load ("to_copy_float_to_int: only 32-bit int<->float convert supported"). bool <-> int
  is refused outright ("bool and integer conversions are unsupported").
"""

from __future__ import annotations

from typing import Any, Optional

import torch

NAME = "webgpu_runtime_gaps"

_CONVERSIONS = ("aten._to_copy.default", "dim_order_ops._to_dim_order_copy.default")


def _stored(dtype: torch.dtype) -> tuple[str, int]:
    """(kind, bytes per element) as the runtime holds a tensor of ``dtype``: the Vulkan serialization stores
    int64 as int32."""
    if dtype == torch.bool:
        return "bool", 1
    if dtype.is_floating_point:
        return "float", torch.empty((), dtype=dtype).element_size()
    return "int", min(torch.empty((), dtype=dtype).element_size(), 4)


def conversion_refused(source: torch.dtype, target: torch.dtype) -> str:
    """Why the runtime cannot convert ``source`` to ``target`` (its own words), or '' when it can."""
    (a, wa), (b, wb) = _stored(source), _stored(target)
    if {a, b} == {"bool", "int"}:
        return "WebGPU to_copy: bool and integer conversions are unsupported"
    if (a, wa) == (b, wb) or (a == "bool" and (b, wb) == ("float", 4)):
        return ""
    if wa != 4 or wb != 4:
        converter = "to_copy_int_to_float" if a != "float" and b == "float" else "to_copy_float_to_int"
        return f"{converter}: only 32-bit int<->float convert supported"
    return ""


def conversion_gaps(node: Any, ctx: Any) -> Optional[Any]:
    """The filter: refuse a conversion the runtime fails to load, naming both dtypes and the runtime's words."""
    from edgeplug.plugin import op_name, refuse

    if getattr(node, "op", None) != "call_function" or op_name(node.target) not in _CONVERSIONS or not node.args:
        return None
    source, value = getattr(node.args[0], "meta", {}).get("val"), node.meta.get("val")
    if not isinstance(source, torch.Tensor) or not isinstance(value, torch.Tensor):
        return None
    why = conversion_refused(source.dtype, value.dtype)
    if not why:
        return None
    return refuse(f"ExecuTorch's WebGPU runtime cannot convert {str(source.dtype).replace('torch.', '')} to "
                  f"{str(value.dtype).replace('torch.', '')} (the delegate would fail at load: '{why}')")
