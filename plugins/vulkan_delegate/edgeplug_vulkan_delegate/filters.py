"""Partitioner filters every backend on the Vulkan delegate shares (``edgeplug_partitioner_filters``).

``activation_fake_quant``: ExecuTorch's Vulkan runtime (cff6f4d, on llvmpipe and on an NVIDIA H200) returns a
standalone ``quantize_per_tensor`` -> ``dequantize_per_tensor`` of a runtime value unchanged: no rounding to the
scale's grid and no clamping to the quantized range (``x = 3.0`` at scale 0.02 in int8 comes back 3.0, eager gives
2.54), in stock ExecuTorch's ``.pte`` as in edgeplug's. The pair stays on the CPU, whose quantized kernels compute
it as eager does. Quantize/dequantize of a constant (a quantized weight the delegate packs) is not touched.

``zero_dim_results``: the same runtime cannot load a delegate in which an op combines 0-d tensors only (``1 - lam``
or ``a * b`` of 0-d parameters: "vector::_M_range_check: __n (which is 18446744073709551615) >= this->size() (which
is 0)" at load_method, stock's ``.pte`` alike). Such scalar arithmetic runs on the CPU; the delegate reads its 0-d
result as it reads a 0-d parameter, which loads and computes as eager (as does an op with one 0-d operand).

``runtime_gaps``: ops ``VulkanPartitioner`` takes (its op registry lists them) for which that runtime has no
kernel, so the delegate fails at load: ``aten.logical_not`` ("Missing operator: aten.logical_not.default", an
abort in build_graph), and ``aten.eq`` of int32 tensors (the runtime asks for the shader
``binary_eq_texture3d_int32``, the build names it ``binary_eq_int32_texture3d``: "Could not find ShaderInfo"; int64
tensors are stored as int32 in the delegate, so their == fails alike).
An integer floor division (``aten.div.Tensor_mode``, ``rounding_mode="floor"``) is computed rounding toward zero
(-7 // 4 gives -1; eager -2; the emulation floors, as eager does). Likewise ``aten.index.Tensor`` of an integer tensor (no ``index_tensor_buffer_int32``; olmoe's expert routing).
They stay on the CPU. Stock ExecuTorch's ``.pte`` of executorch's own Llama example and of transformers' decoders
fails to load on both.
ExecuTorch's backend test suite, run in that runtime (docs/benchmarks.md), found more, each failing stock's ``.pte``
too and kept on the CPU here: a reduction over no dim list or over more than 2 dims ("Only 1 or 2 dimensions
supported"), ``argmax``/``argmin`` with ``keepdim=True`` (texture storage; "is_buffer_storage(in)"), an
``aten.index.Tensor`` whose index list has more than one entry (a reflect or replicate padding: "only one index
tensor is supported"), and a float division with ``rounding_mode="trunc"`` (computed as a floor division).
A reduction (``amax``, ``amin``, ``sum``, ``mean``) over dim 0 or 1 of a 4-d tensor of batch > 1 fails at load
(``batched_reduction_refused``; found by ExecuTorch's backend test suite run in that runtime, ``test_amax_dim``):
stock's partitioner takes it with ``keepdim=True`` (its ``.pte`` fails alike), and the Vulkan family's
``reduce_with_keepdim`` rewrite gives it ``keepdim``.
torchao's ``dequantize_affine`` has no kernel of its own in that runtime either ("Missing operator:
torchao.dequantize_affine.default", an abort): only ExecuTorch's fused quantized linears absorb it (a weight's
dequantize into ``linear_q4gsw`` / ``linear_dq8ca_q4gsw``). The dequantized table of a quantized embedding
(optimum-executorch's ``--qembedding 8w`` or ``4w``: ``embedding(dequantize_affine(table))``) matches no such pattern,
so the dequantize and its embedding stay on the CPU, where ``to_executorch`` fuses them into
``quantized_decomposed.embedding_byte`` / ``embedding_4bit`` for ExecuTorch's quantized kernels.
"""

from __future__ import annotations

from typing import Any, Optional

from edgeplug.plugin import op_name, refuse, tensor_of

NAME = "activation_fake_quant"
ZERO_DIM_NAME = "zero_dim_results"
ZERO_DIM_REASON = (
    "it combines 0-d tensors only: ExecuTorch's Vulkan runtime cannot load a delegate with such an op "
    "(vector::_M_range_check at load_method), so this scalar arithmetic runs on the CPU"
)

_QUANTIZE = {"quantized_decomposed.quantize_per_tensor.default", "quantized_decomposed.quantize_per_tensor.tensor"}
_DEQUANTIZE = {"quantized_decomposed.dequantize_per_tensor.default", "quantized_decomposed.dequantize_per_tensor.tensor"}

REASON = (
    "a quantize/dequantize of a runtime value: ExecuTorch's Vulkan runtime passes such a pair through unchanged "
    "(no rounding, no clamping), so it runs on the CPU's quantized kernels"
)


def _is_runtime_quantize(node: Any, ctx: Any) -> bool:
    return (
        getattr(node, "op", None) == "call_function" and op_name(node.target) in _QUANTIZE
        and not ctx.is_constant_only(node)
    )


def activation_fake_quant(node: Any, ctx: Any) -> Optional[Any]:
    """Refuse a quantize of a runtime value, and the dequantize that reads one."""
    if getattr(node, "op", None) != "call_function":
        return None
    name = op_name(node.target)
    if name in _QUANTIZE and _is_runtime_quantize(node, ctx):
        return refuse(REASON)
    if name in _DEQUANTIZE and node.args and _is_runtime_quantize(node.args[0], ctx):
        return refuse(REASON)
    return None


def zero_dim_results(node: Any, ctx: Any) -> Optional[Any]:
    """Refuse an op all of whose tensor operands (two or more) are 0-d: the runtime cannot load it. An op
    with one 0-d operand (a 0-d clone, a tensor times a 0-d parameter) loads and computes as eager."""
    if getattr(node, "op", None) != "call_function":
        return None
    operands = [tensor_of(a) for a in node.args if hasattr(a, "op")]
    if len(operands) >= 2 and all(t is not None and t.dim() == 0 for t in operands):
        return refuse(ZERO_DIM_REASON)
    return None


RUNTIME_GAPS_NAME = "runtime_gaps"


_QUANTIZED_EMBEDDING_REASON = (
    "ExecuTorch's Vulkan runtime has no kernel for torchao.dequantize_affine outside a fused quantized linear "
    "(its partitioner takes it; the delegate would fail at load with 'Missing operator'): a quantized embedding's "
    "dequantize and lookup run on the CPU, as executorch's quantized embedding kernel"
)


#: the reductions ExecuTorch's Vulkan runtime builds with add_reduce_node / add_reduce2d_node (Reduce.cpp)
_REDUCTIONS = ("aten.amax.default", "aten.amin.default", "aten.sum.dim_IntList", "aten.mean.dim")


def _arg(node: Any, index: int, name: str, default: Any) -> Any:
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def _many_dims_refused(node: Any) -> str:
    """Why the Vulkan runtime cannot load this reduction over more than two dims or over no dim list (every dim, a
    1-d tensor's too), or '' (Reduce.cpp: 'Only 1 or 2 dimensions supported')."""
    value = tensor_of(node.args[0]) if node.args and hasattr(node.args[0], "op") else None
    if value is None:
        return ""
    dim = _arg(node, 1, "dim", None)
    if dim in (None, []):  # every dim: the runtime counts the list it is given, here empty
        given = "no dim list (every dim)"
    else:
        count = 1 if isinstance(dim, int) else len(dim)
        if count <= 2:
            return ""
        given = f"{count} dims"
    return (f"ExecuTorch's Vulkan runtime reduces over a list of 1 or 2 dims, not {given} (Reduce.cpp: 'Only 1 or 2 "
            "dimensions supported'; the delegate would fail at load), so it runs on the CPU")


def batched_reduction_refused(node: Any) -> str:
    """Why the Vulkan runtime cannot load this reduction, or '': over the batch or channel dim of a 4-d tensor of
    batch > 1 it refuses the delegate (its texture stacks the batches along the channel axis; Reduce.cpp checks
    ``concat_dim_of(in) != reduce_dim``, and a reduction over the batch fails reading its sizes)."""
    value = tensor_of(node.args[0]) if node.args and hasattr(node.args[0], "op") else None
    if value is None or value.dim() != 4 or (isinstance(value.shape[0], int) and value.shape[0] == 1):
        return ""
    dim = _arg(node, 1, "dim", None)
    dims = list(range(4)) if dim in (None, []) else [dim] if isinstance(dim, int) else list(dim)
    reduced = sorted({d % 4 for d in dims if isinstance(d, int)} & {0, 1})
    if not reduced:
        return ""
    over = " and ".join(("the batch dim (0)", "the channel dim (1)")[d] for d in reduced)
    return (f"ExecuTorch's Vulkan runtime cannot load a reduction over {over} of a 4-d tensor of batch "
            f"{value.shape[0]} (its texture stacks batches along the channel axis; the delegate would fail at load: "
            "'(graph.concat_dim_of(in) != reduce_dim) is false'), so it runs on the CPU")


def runtime_gaps(node: Any, ctx: Any) -> Optional[Any]:
    """Refuse an op ExecuTorch's Vulkan runtime has no kernel for, though its partitioner takes it."""
    if getattr(node, "op", None) != "call_function":
        return None
    name = op_name(node.target)
    if name == "aten.logical_not.default":
        return refuse("ExecuTorch's Vulkan runtime has no kernel for aten.logical_not (its partitioner takes it; "
                      "the delegate would fail at load with 'Missing operator')")
    if name.startswith("aten.eq."):
        values = [tensor_of(a) for a in node.args[:2] if hasattr(a, "op")]
        # int64 too: the delegate stores int64 tensors as int32
        if any(v is not None and str(v.dtype) in ("torch.int32", "torch.int64") for v in values):
            return refuse("ExecuTorch's Vulkan runtime looks up binary_eq_texture3d_int32, a shader its build "
                          "names binary_eq_int32_texture3d (binary_eq_buffer_int32 likewise): an integer == fails at load")
    if name == "aten.div.Tensor_mode" and node.kwargs.get("rounding_mode") == "floor":
        value = tensor_of(node)
        if value is not None and not value.dtype.is_floating_point:
            return refuse("ExecuTorch's Vulkan runtime rounds an integer floor division toward zero "
                          "(-7 // 4 gives -1, eager -2), so it runs on the CPU")
    if name == "torchao.dequantize_affine.default" and any(op_name(u.target) == "aten.embedding.default"
                                                           for u in node.users if u.op == "call_function"):
        return refuse(_QUANTIZED_EMBEDDING_REASON)
    if name == "aten.embedding.default" and node.args and hasattr(node.args[0], "op") \
            and node.args[0].op == "call_function" and op_name(node.args[0].target) == "torchao.dequantize_affine.default":
        return refuse(_QUANTIZED_EMBEDDING_REASON)
    if name in _REDUCTIONS:
        why = batched_reduction_refused(node) or _many_dims_refused(node)
        if why:
            return refuse(why)
    if name in ("aten.argmax.default", "aten.argmin.default") and _arg(node, 2, "keepdim", False):
        return refuse("ExecuTorch's Vulkan runtime cannot load an argmax/argmin with keepdim=True (its partitioner "
                      "gives it texture storage; ArgReduce.cpp: '(graph.is_buffer_storage(in)) is false')")
    if name == "aten.div.Tensor_mode" and node.kwargs.get("rounding_mode") == "trunc":
        value = tensor_of(node)
        if value is not None and value.dtype.is_floating_point:
            return refuse("ExecuTorch's Vulkan runtime rounds a float division with rounding_mode='trunc' toward "
                          "minus infinity (-7 / 4 gives -2, eager -1), so it runs on the CPU")
    if name == "aten.index.Tensor" and len(node.args) > 1 and len(node.args[1]) > 1:
        # the list's length counts, None entries (the dims not indexed before an index tensor) included
        return refuse("ExecuTorch's Vulkan runtime takes an index list of one entry only (IndexTensor.cpp: "
                      "'index.Tensor: only one index tensor is supported'; a reflect or replicate padding indexes "
                      "its last dim, x[:, :, idx]), so it runs on the CPU")
    if name == "aten.index.Tensor":
        value = tensor_of(node.args[0]) if node.args and hasattr(node.args[0], "op") else None
        if value is not None and str(value.dtype) in ("torch.int32", "torch.int64"):
            return refuse("ExecuTorch's Vulkan runtime has no index_tensor_buffer_int32 shader (its partitioner takes "
                          "an integer tensor's aten.index.Tensor; the delegate would fail at load)")
    return None
