"""The rewrites a backend on the Vulkan delegate runs before partitioning.

``canonical_rewrites`` picks the core's exact rewrites into ops the delegate
implements and adds the family's own pass, ``quantized_linear_inputs_at_their_width``.
"""

from __future__ import annotations

from typing import Any, Iterator

from edgeplug.plugin import PassSpec


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
    """The core's exact rewrites (``edgeplug.plugin.rewrite_pass``) into ops the delegate implements.

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

    # SDPA's safe softmax at a dynamic sequence length (a KV-cache decoder): any_as_amax needs static
    # sizes, so its bool guard (eq, logical_not, any, where) becomes float ops the delegate has
    yield rewrite_pass("safe_softmax_as_floats", backend=backend, dtypes=FLOATS, before="scalar_to_tensor")
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


def quantized_linear_inputs_at_their_width(ep: Any) -> Any:
    """A quantized linear's input view reads a tensor whose last size is the linear's width.

    The delegate's quantized-linear pattern (executorch's ``QuantizedLinearMatch``) takes the
    input of the one ``view_copy`` before ``mm`` as the op's input and its last size as the
    input channels. That holds for ``linear``'s own decomposition (``[B, S, K] -> [B*S, K]``),
    but ``collapse_view_chains`` lets the view read further back: an attention output
    ``[1, S, H, D]`` viewed straight to ``[S, H*D]``, where the fused op would read ``D``
    channels instead of ``H*D`` (seen: o_proj of a transformers Llama, w4). A view to
    ``[numel / K, K]`` is put back between them; the values do not change. Returns the program
    with a record of each view put back (``PassResult``).
    """
    import torch

    from edgeplug.plugin import NodeBuilder, PassResult, calls_to, is_static, note_rewrite, op_name, tensor_of

    build = NodeBuilder(ep)
    records = []
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
        records.append(note_rewrite(
            QUANTIZED_LINEAR_INPUTS, x, 1,
            f"{node.name}'s input views {source.name} {list(src.shape)}: through [{src.numel() // width}, {width}] "
            f"first, so the quantized linear reads {width} input channels, not {src.shape[-1]}",
            removed=0,
        ))
    for node in calls_to(ep, _LINEAR_ANCHORS[:3]):
        record = _output_view_at_its_width(build, node)
        if record is not None:
            records.append(record)
    return PassResult(ep, records)  # the pass runner lints and recompiles what changed


def _output_view_at_its_width(build: Any, node: Any) -> Any:
    """A quantized linear's one output view makes the fused op's own shape, ``[*input[:-1], N]``.

    The same executorch pattern takes the one ``view_copy`` after ``mm`` (when it has one user) as
    the linear's output and gives the fused op that view's shape, though the op computes
    ``[*input[:-1], N]``. After ``collapse_view_chains`` that view may go straight on to the heads
    (``[S, N] -> [1, S, H, D]``, q/k/v of an 8da4w decoder): the fused node's recorded shape is
    then 4-d, its output 2-d, and the permute after it fails in ``FusePatternsPass`` ("Dimension
    out of range"). A view to the op's own shape is put back before it; the values do not change.
    """
    import torch

    from edgeplug.plugin import note_rewrite, op_name, tensor_of

    addmm = op_name(node) == "aten.addmm.default"
    x, weight = (node.args[1], node.args[2]) if addmm else (node.args[0], node.args[1])
    if not (isinstance(x, torch.fx.Node) and _dequantized(weight)) or len(node.users) != 1:
        return None
    (after,) = node.users
    if op_name(after) != "aten.view_copy.default" or len(after.users) != 1:
        return None
    source = x.args[0] if op_name(x) == "aten.view_copy.default" else x
    src, out, viewed = tensor_of(source), tensor_of(node), tensor_of(after)
    if src is None or out is None or viewed is None or src.dim() == 0:
        return None
    own = [*src.shape[:-1], out.shape[-1]]
    if list(viewed.shape) == own or sum(1 for d in own if type(d) is not int) > 1:
        return None
    inner = build.view(after, node, own)
    after.args = (inner, *after.args[1:])
    return note_rewrite(
        QUANTIZED_LINEAR_INPUTS, after, 1,
        f"{node.name}'s output view to {list(viewed.shape)}: through {own} first, so the quantized linear "
        f"the delegate fuses has its own output shape",
        removed=0,
    )
