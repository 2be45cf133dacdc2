"""Records every backend on executorch's Vulkan delegate shares (vulkan, webgpu, a third party's).

What a backend serialized by the Vulkan delegate gets from the delegate
itself, not from its own choices: the ops the delegate keeps whole, how
``et_vk.rms_norm`` is fused for a runtime that prepacks its weight, the
per-node support check, the scope that keeps executorch's own RMSNorm
pattern out, and the weight-only quantization schemes of ``VulkanQuantizer``.
A plugin's hooks.py yields these with its backend name and adds what is its
own (partitioner, description, kernels, whether its kernel accumulates in fp32),
and the core's canonicalizing rewrites the delegate's ops call for.
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Any, Callable, Iterator

from edgeplug.plugin import BackendSpec, FusionPolicy, KeepWhole, PassSpec, QuantScheme

from edgeplug_vulkan.fusion import fusable_subgraphs_matched_once, load_et_vk_ops, without_executorch_vulkan_pattern
from edgeplug_vulkan.support import support_check


def delegate_constants(original: Any, named: Any) -> Any:
    from edgeplug_vulkan.preprocess import VulkanConstants

    return VulkanConstants(original, named)

#: the delegate's serialized id (WebGPUPartitioner tags partitions for it too)
BACKEND_ID = "VulkanBackend"


@contextlib.contextmanager
def lowering_context() -> Iterator[None]:
    # executorch's own Vulkan rms_norm pattern would fuse what the core refused;
    # its pattern search, run by the partitioner, is not run again by the support check
    with without_executorch_vulkan_pattern("rms_norm"), fusable_subgraphs_matched_once():
        yield


def backend_spec(backend: str, *, description: str, partitioner: Callable[[], Any]) -> BackendSpec:
    """A backend serialized by the Vulkan delegate, verified on the host with its kernels."""
    return BackendSpec(
        backend=backend,
        description=description,
        backend_id=BACKEND_ID,
        partitioner=partitioner,
        verify_method="kernels",
        lowering_context=lowering_context,
        support_check=support_check,
        delegate_constants=delegate_constants,
    )


def keep_whole(backend: str) -> KeepWhole:
    """Ops the Vulkan delegate has whole-op shaders for."""
    import torch

    aten = torch.ops.aten
    return KeepWhole(backend=backend, ops=(aten.hardswish.default, aten.upsample_nearest2d.vec, aten.pixel_shuffle.default))


#: the delegate's elementwise ops (and cat) with kernels for at most 4 dims (executorch's
#: op_registry registers them without ``supports_highdim``)
FOUR_DIM_OPS = (
    *(f"aten.{op}.default" for op in (
        "abs", "cos", "exp", "gelu", "hardshrink", "hardswish", "hardtanh", "neg", "relu", "sigmoid", "sin", "sqrt",
        "rsqrt", "tanh", "round", "leaky_relu", "log10", "clamp", "full_like", "ones_like", "zeros_like", "cat",
    )),
    "aten.where.self",
)


def canonical_rewrites(backend: str) -> Iterator[PassSpec]:
    """The core's exact rewrites into ops the delegate implements (``edgeplug._graph.canonical``).

    It has ``mul.Tensor`` (``add``, ``sub``, ``div``) for fp16 and fp32 but no ``.Scalar`` form,
    float reductions (``amax``, ``sum``) but no ``any`` (the safe softmax of SDPA's decomposition)
    and no integer sum (a MoE router's token counts), and reduces other than the last dim only
    with ``keepdim`` (a MoE's sum over its top-k experts); ``FOUR_DIM_OPS`` take up to 4 dims
    (a Mamba-2 scan's 5-d masks), its views any rank. It has no ``cumsum``: a scan of two values
    (Mamba-2's chunk-level sum with one chunk) becomes adds. Each ``view_copy`` is a copy on the
    GPU, so chains of views (a squeeze then an unsqueeze, the views ``collapse_rank`` puts
    between two collapsed ops) are collapsed last.
    """
    from edgeplug.plugin import FLOATS, rewrite_pass

    yield rewrite_pass("scalar_to_tensor", backend=backend, dtypes=FLOATS)
    yield rewrite_pass("any_as_amax", backend=backend)
    yield rewrite_pass("collapse_rank", backend=backend, max_rank=4, ops=FOUR_DIM_OPS)
    yield rewrite_pass("int_sum_in_float", backend=backend)
    yield rewrite_pass("reduce_with_keepdim", backend=backend)
    yield rewrite_pass("short_cumsum_as_adds", backend=backend)
    yield rewrite_pass(
        "collapse_view_chains", backend=backend, after=("collapse_rank", "reduce_with_keepdim", "int_sum_in_float")
    )
    yield PassSpec(
        backend=backend, stage="pre_partition", name=QUANTIZED_LINEAR_INPUTS, fn=quantized_linear_inputs_at_their_width,
        after=("collapse_view_chains",),
    )


#: the pass below, by name
QUANTIZED_LINEAR_INPUTS = "quantized_linear_inputs_at_their_width"
_LINEAR_ANCHORS = ("aten.mm.default", "aten.addmm.default", "aten.linear.default", "aten.bmm.default")


def _dequantized(node: Any, steps: int = 4) -> bool:
    """Whether ``node`` is, or views/permutes, a dequantize (a quantized linear's weight)."""
    from edgeplug.plugin import is_qdq, op_name

    for _ in range(steps):
        if not hasattr(node, "op") or node.op != "call_function":
            return False
        if is_qdq(node.target) and "dequantize" in op_name(node):
            return True
        node = node.args[0] if node.args else None
    return False


def quantized_linear_inputs_at_their_width(ep: Any) -> None:
    """A quantized linear's input view reads a tensor whose last size is the linear's width.

    The delegate's quantized-linear pattern (executorch's ``QuantizedLinearMatch``) takes the
    input of the one ``view_copy`` before ``mm`` as the op's input and its last size as the
    input channels. That holds for ``linear``'s own decomposition (``[B, S, K] -> [B*S, K]``),
    but ``collapse_view_chains`` lets the view read further back: an attention output
    ``[1, S, H, D]`` viewed straight to ``[S, H*D]``, where the fused op would read ``D``
    channels instead of ``H*D`` (seen: o_proj of a transformers Llama, w4). A view to
    ``[numel / K, K]`` is put back between them; the values do not change.
    """
    import torch

    from edgeplug.plugin import NodeBuilder, calls_to, is_static, note_rewrite, op_name, tensor_of

    build = NodeBuilder(ep)
    changed = False
    for node in calls_to(ep, _LINEAR_ANCHORS):
        addmm = op_name(node) == "aten.addmm.default"
        x, weight = (node.args[1], node.args[2]) if addmm else (node.args[0], node.args[1])
        if not (isinstance(x, torch.fx.Node) and op_name(x) == "aten.view_copy.default" and _dequantized(weight)):
            continue
        source = x.args[0]
        src, out = tensor_of(source), tensor_of(x)
        if not isinstance(source, torch.fx.Node) or not is_static(src, out) or src.dim() == 0:
            continue
        width = out.shape[-1]
        if src.shape[-1] == width or src.numel() % width:
            continue
        inner = build.view(x, source, [src.numel() // width, width])
        x.args = (inner, *x.args[1:])
        changed = True
        note_rewrite(
            QUANTIZED_LINEAR_INPUTS, x, 1,
            f"{node.name}'s input views {source.name} {list(src.shape)}: through [{src.numel() // width}, {width}] "
            f"first, so the quantized linear reads {width} input channels, not {src.shape[-1]}",
            removed=0,
        )
    if changed:
        ep.graph_module.recompile()


def rms_norm_policy(backend: str, *, fp32_accumulation: bool) -> FusionPolicy:
    """``et_vk.rms_norm(input, weight, eps)`` for a runtime that prepacks the weight.

    Only a leaf constant of shape [D] may be the fused op's weight; computed
    constants are folded first; a runtime scale stays a separate multiply
    after a unit-weight norm. ``fp32_accumulation`` is the backend's kernel's
    own property.
    """
    return FusionPolicy(
        backend=backend,
        pattern="rms_norm",
        target="et_vk.rms_norm",
        arguments=("input", "weight", "eps"),
        load_target=load_et_vk_ops,
        dequantized_weights="fold",
        weight_sources=frozenset({"leaf"}),
        fold_computed_constants=True,
        unit_weight_fallback=True,
        fp32_accumulation=fp32_accumulation,
    )


def _weight_only(bits: int) -> Any:
    from executorch.backends.vulkan.quantizer.vulkan_quantizer import VulkanQuantizer, get_symmetric_quantization_config

    return VulkanQuantizer().set_global(get_symmetric_quantization_config(weight_bits=bits))


def weight_only_schemes(backend: str) -> Iterator[QuantScheme]:
    """Weight-only linear schemes: executorch's VulkanQuantizer (8 and 4 bits per channel), torchao's int4 in groups."""
    for bits in (8, 4):
        yield QuantScheme(
            backend=backend, scheme=f"w{bits}", factory=partial(_weight_only, bits),
            activation_bits=None, weight_bits=bits, per_channel=True,
            description=f"weight-only: {bits}-bit per-channel linear weights, float activations (VulkanQuantizer)",
        )
    # torchao's grouped int4 weight-only linear, which the delegate packs into its own linear_q4gsw
    # (executorch's vulkan quantized_linear pattern). Its 8da4w form (linear_dq8ca_q4gsw) is not
    # offered: the delegate's pattern fails on a transformers Llama's attention output (a 4-d permute)
    yield QuantScheme(
        backend=backend, scheme="w4-g32", kind="source_transform", factory=partial(_torchao_int4_weights, 32),
        activation_bits=None, weight_bits=4, per_channel=False,
        description="weight-only: int4 symmetric linear weights in groups of 32, float activations "
        "(torchao IntxWeightOnlyConfig; the delegate's linear_q4gsw)",
    )


def _torchao_int4_weights(group_size: int) -> Any:
    import torch
    from torchao.quantization import IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerGroup

    return IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(group_size))
