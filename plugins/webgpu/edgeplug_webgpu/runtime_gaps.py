"""What ExecuTorch's WebGPU runtime refuses among the ops it lists, found by running edgeplug's programs in it
(tools/webgpu-runtime, docs/benchmarks.md "ExecuTorch's WebGPU runtime"). A partitioner filter keeps each such
node on the CPU, with its reason in the report; the op list itself is ``runtime_ops``'s.

- A dtype conversion (``_to_copy``, ``_to_dim_order_copy``) between two float widths: the runtime (cff6f4d,
  ``ops/to_copy/ToCopy.cpp``) copies bytes when both ends have one kind and width, turns bool into float32,
  and sends everything else to its int<->float converter, which takes 32-bit ends only; float32 <-> float16
  therefore fails at load ("to_copy_float_to_int: only 32-bit int<->float convert supported"). bool <-> int
  is refused outright ("bool and integer conversions are unsupported").
- A per-channel int8 weight's dequantize feeding a matmul: the Vulkan delegate's serialization fuses the pair
  into ``aten._weight_int8pack_mm``, which the WebGPU runtime does not implement ("WebGPU backend: unsupported
  op: aten._weight_int8pack_mm.default"), so the program fails to load. The dequantize runs on the CPU and the
  matmul, now of a float weight, on the GPU (correct; the weight crosses as float32 each call).
- A reduction the runtime's kernels do not cover (``reduction_refused``; found by ExecuTorch's backend test suite
  run in the runtime, docs/benchmarks.md): ``amax``/``amin`` and ``argmax``/``argmin`` reduce the last dim only
  (``ops/amax``, ``ops/argmax``: "only last-dim reduction is supported"), ``sum.dim_IntList``/``mean.dim`` a run of
  adjacent dims ("only contiguous reduced dims supported"; a dim list must be given: ``x.mean()`` fails with "dim
  arg is not an IntList"), all of float32 only (they size their buffers by
  ``sizeof(float)``). ``VulkanPartitioner`` takes a reduction over another dim with ``keepdim`` (the Vulkan
  runtime has a general reduce), and the Vulkan family's ``reduce_with_keepdim`` rewrite gives it one: without
  this filter a webgpu ``amax(x, dim=0)`` is delegated and its program fails to load.
- An ``expand_copy`` whose sizes hold -1 (keep that dim: ``x.expand(8, -1)``): the runtime refuses it at load
  ("WebGPU expand_copy: inferred target sizes are unsupported"; the suite's ``test_expand_keep_original_size``).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

NAME = "webgpu_runtime_gaps"
INT8_NAME = "webgpu_int8_matmul_weight"
REDUCE_NAME = "webgpu_reduction_gaps"
EXPAND_NAME = "webgpu_expand_inferred_sizes"

_CONVERSIONS = ("aten._to_copy.default", "dim_order_ops._to_dim_order_copy.default")
_INT8_DEQUANTIZE = "quantized_decomposed.dequantize_per_channel.default"
_MATMULS = ("aten.mm.default", "aten.addmm.default", "aten.linear.default", "aten.bmm.default")
#: reductions the runtime registers, and where their reduced dims are (the argument index; None: every dim)
_LAST_DIM_ONLY = {"aten.amax.default": "amax", "aten.amin.default": "amin",
                  "aten.argmax.default": "arg_reduce", "aten.argmin.default": "arg_reduce"}
_CONTIGUOUS_DIMS = ("aten.sum.dim_IntList", "aten.mean.dim")
_VIEWS = ("aten.permute_copy.default", "aten.t_copy.default", "aten.view_copy.default", "aten.transpose_copy.int",
          "aten.unsqueeze_copy.default", "aten.squeeze_copy.dims", "aten.expand_copy.default")


def _feeds_a_matmul(node: Any, op_name: Any) -> bool:
    """Whether ``node``'s value reaches a matmul, directly or through views of it (a weight's transpose)."""
    todo, seen = list(node.users), set()
    while todo:
        user = todo.pop()
        if user in seen or user.op != "call_function":
            continue
        seen.add(user)
        name = op_name(user.target)
        if name in _MATMULS:
            return True
        if name in _VIEWS:
            todo.extend(user.users)
    return False


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


def int8_matmul_weight(node: Any, ctx: Any) -> Optional[Any]:
    """The filter: refuse an int8 per-channel dequantize that feeds a matmul (the serialization would make the pair
    aten._weight_int8pack_mm, which the runtime lacks)."""
    from edgeplug.plugin import op_name, refuse

    if getattr(node, "op", None) != "call_function" or op_name(node.target) != _INT8_DEQUANTIZE or not node.args:
        return None
    source = getattr(node.args[0], "meta", {}).get("val")
    if not isinstance(source, torch.Tensor) or source.dtype != torch.int8:
        return None
    if not _feeds_a_matmul(node, op_name):
        return None
    return refuse("ExecuTorch's WebGPU runtime does not implement aten._weight_int8pack_mm, which the Vulkan "
                  "serialization makes of an int8 per-channel dequantize and its matmul (the delegate would fail at "
                  "load: 'unsupported op'); the weight is dequantized on the CPU")


def _reduced_dims(node: Any, ndim: int) -> Optional[list[int]]:
    """The dims ``node`` reduces, made non-negative and sorted; None where it reduces every dim (no dim given)."""
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dim is None or dim == []:
        return None
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted(d + ndim if d < 0 else d for d in dims if isinstance(d, int))


def reduction_refused(name: str, dtype: torch.dtype, ndim: int, dims: Optional[list[int]]) -> str:
    """Why the runtime cannot run the reduction ``name`` (``aten.amax.default``...) of a ``dtype`` tensor of
    ``ndim`` dims over ``dims`` (None: all), in its own words, or '' when it can."""
    if name not in _LAST_DIM_ONLY and name not in _CONTIGUOUS_DIMS:
        return ""
    short = _LAST_DIM_ONLY.get(name, "WebGPU reduce")
    if dtype != torch.float32:
        return f"{short}: fp32-only"
    if ndim == 0:
        return f"{short}: input must have at least one dim"
    if name in _LAST_DIM_ONLY:
        if dims != [ndim - 1]:  # every dim (no dim given) included: the kernels read exactly one
            return f"{short}: only last-dim reduction is supported"
        return ""
    if dims is None:  # x.mean(), x.sum(): the dim argument is None or empty
        return "WebGPU reduce: dim arg is not an IntList"
    if dims != list(range(dims[0], dims[0] + len(dims))):
        return "WebGPU reduce: only contiguous reduced dims supported"
    return ""


def reduction_gaps(node: Any, ctx: Any) -> Optional[Any]:
    """The filter: refuse a reduction the runtime's kernels do not cover (``reduction_refused``), naming its dims,
    dtype and the runtime's words."""
    from edgeplug.plugin import op_name, refuse

    if getattr(node, "op", None) != "call_function" or not node.args:
        return None
    name = op_name(node.target)
    source = getattr(node.args[0], "meta", {}).get("val")
    if (name not in _LAST_DIM_ONLY and name not in _CONTIGUOUS_DIMS) or not isinstance(source, torch.Tensor):
        return None
    dims = _reduced_dims(node, source.dim())
    why = reduction_refused(name, source.dtype, source.dim(), dims)
    if not why:
        return None
    over = "every dim" if dims is None else f"dim {dims[0]}" if len(dims) == 1 else f"dims {dims}"
    return refuse(f"ExecuTorch's WebGPU runtime cannot reduce this {str(source.dtype).replace('torch.', '')} "
                  f"tensor of {source.dim()} dims over {over} (the delegate would fail at load: '{why}')")


def expand_inferred_sizes(node: Any, ctx: Any) -> Optional[Any]:
    """The filter: refuse an ``expand_copy`` given -1 for a size (the runtime takes explicit sizes only)."""
    from edgeplug.plugin import op_name, refuse

    if getattr(node, "op", None) != "call_function" or op_name(node.target) != "aten.expand_copy.default":
        return None
    sizes = node.args[1] if len(node.args) > 1 else node.kwargs.get("size", ())
    if not any(isinstance(s, int) and s == -1 for s in sizes):
        return None
    return refuse("ExecuTorch's WebGPU runtime takes an expand's sizes only as numbers, not -1 (the delegate would "
                  "fail at load: 'WebGPU expand_copy: inferred target sizes are unsupported')")
