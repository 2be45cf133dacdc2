"""A complete edgeplug backend: XNNPACK, the example for third-party authors.

A ``BackendSpec`` naming an executorch partitioner, a partitioner filter that
refuses with its own reason, an export-stage pass, the core's exact rewrites
into forms its partitioner takes (``rewrite_pass``), and the
backend's quantization scheme; an entry point in ``pyproject.toml`` makes it a plugin::

    [project.entry-points.edgeplug]
    xnnpack = "edgeplug_xnnpack.hooks"

XNNPACK runs in executorch's own Python runtime, so ``verify_method="pte"``:
the core executes the real .pte and compares it against eager. The author's
guide is docs/writing-a-backend.md.
"""

from __future__ import annotations

from edgeplug.plugin import FLOATS, BackendSpec, PartitionerFilter, PassSpec, QuantScheme, hookimpl, rewrite_pass

from edgeplug_xnnpack import filters, passes

BACKEND = "xnnpack"


def _partitioner():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner()


@hookimpl
def edgeplug_backends():
    yield BackendSpec(
        backend=BACKEND,
        description="XNNPACK on the CPU (runs in executorch's Python runtime)",
        backend_id="XnnpackBackend",
        partitioner=_partitioner,
        verify_method="pte",
        external_weights=True,  # xnnpack_preprocess stores tagged weights in named data
    )


@hookimpl
def edgeplug_partitioner_filters():
    yield PartitionerFilter(backend=BACKEND, name=filters.NAME, fn=filters.no_float64)


@hookimpl
def edgeplug_passes():
    yield PassSpec(backend=BACKEND, stage="export", name=passes.NAME, fn=passes.div_by_power_of_two_to_mul)
    # the core's exact rewrites into forms XNNPACK's partitioner takes (fp32 / fp16 ops)
    yield rewrite_pass("drop_identity_copies", backend=BACKEND)
    # a cache returned transposed and transposed back (executorch's custom-op Llama): XNNPACK would copy it twice
    yield rewrite_pass("cancel_inverse_permutes", backend=BACKEND)
    # a dynamic sequence length (KV-cache decoders): its slices refuse a symbolic input size, and it has no
    # eq / logical_not / any / where config; both rewrites make ops it takes (mm, clamp, add, mul)
    yield rewrite_pass("rotate_half_as_matmul", backend=BACKEND, symbolic_only=True, dtypes=FLOATS)
    yield rewrite_pass("safe_softmax_as_floats", backend=BACKEND, dtypes=FLOATS, before="scalar_to_tensor")
    # each layer repeats the mask's where and the position arithmetic on the CPU: computed once
    yield rewrite_pass("merge_duplicates", backend=BACKEND)
    yield rewrite_pass("scalar_to_tensor", backend=BACKEND, dtypes=FLOATS)  # no mul.Scalar config
    yield rewrite_pass("mean_at_rank", backend=BACKEND, rank=4, dims=(2, 3), dtypes=FLOATS)  # 4-d means only
    yield rewrite_pass("unsqueeze_as_view", backend=BACKEND, except_trailing=True, dtypes=FLOATS)
    yield rewrite_pass("squeeze_as_view", backend=BACKEND, dtypes=FLOATS)  # no squeeze config
    # its view takes int sizes with at most one -1: a dynamic program's views name sym_size nodes
    yield rewrite_pass("symbolic_view_sizes", backend=BACKEND, dtypes=FLOATS)
    yield rewrite_pass("cat_distinct_inputs", backend=BACKEND, dtypes=FLOATS)  # its cat counts distinct inputs
    yield rewrite_pass("split_as_slices", backend=BACKEND, dtypes=FLOATS)  # no split config: fused qkv, gate/up
    yield rewrite_pass("select_as_slice", backend=BACKEND, dtypes=FLOATS)  # no select config: state-space scans
    # its conv wants the weight a parameter: a squeeze and unsqueeze of it (Mamba's depthwise conv) are views
    # to collapse; before expand_as_cat, whose same-shape views are on purpose
    yield rewrite_pass("collapse_view_chains", backend=BACKEND, after=("squeeze_as_view", "unsqueeze_as_view"), before="expand_as_cat")
    # no where, full_like or cumsum config: a segment sum's constant masks, chunk states' zeros, a 2-value scan
    yield rewrite_pass("where_static_mask", backend=BACKEND, dtypes=FLOATS)
    yield rewrite_pass("cat_fill_as_pad", backend=BACKEND, dtypes=FLOATS)
    yield rewrite_pass("short_cumsum_as_adds", backend=BACKEND, dtypes=FLOATS)
    # its cat takes two or more distinct inputs (its preprocess splits cats of more than 5)
    yield rewrite_pass("expand_as_cat", backend=BACKEND, distinct_inputs=True, dtypes=FLOATS)


def _symmetric_per_channel():
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))


def _int8_dynamic_int4_weight(group_size: int):
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig
    from torchao.quantization.granularity import PerGroup

    return Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(group_size))


def _is_embedding(module, fqn: str) -> bool:
    import torch

    return isinstance(module, torch.nn.Embedding)


def _int_embeddings(bits: int, group_size: int):
    """torchao weight-only on the embedding tables; XNNPACK takes no embedding, but executorch's quantized
    kernels do: the lowering turns dequantize + embedding into quantized_decomposed.embedding_{byte,4bit}."""
    import torch
    from torchao.quantization import IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerGroup

    return [(IntxWeightOnlyConfig(weight_dtype=getattr(torch, f"int{bits}"), granularity=PerGroup(group_size)), _is_embedding)]


@hookimpl
def edgeplug_quantizers():
    from functools import partial

    yield QuantScheme(
        backend=BACKEND, scheme="8a8w", factory=_symmetric_per_channel, activation_bits=8, weight_bits=8,
        per_channel=True, description="8-bit activations, 8-bit symmetric per-channel weights (XNNPACKQuantizer)",
    )
    # torchao's quantize_ on the linear layers, as ExecuTorch's LLM flows do; XNNPACK takes the dynamically
    # quantized linear with grouped int4 weights (its partitioner's quant-affine configs)
    for scheme, group in (("8da4w", 32), ("8da4w-g128", 128)):
        yield QuantScheme(
            backend=BACKEND, scheme=scheme, kind="source_transform", factory=partial(_int8_dynamic_int4_weight, group),
            activation_bits=8, weight_bits=4, per_channel=False,
            description=f"int8 dynamic per-token activations, int4 symmetric weights in groups of {group} "
            "(torchao Int8DynamicActivationIntxWeightConfig on linear layers)",
        )
    for bits in (8, 4):
        yield QuantScheme(
            backend=BACKEND, scheme=f"e{bits}", kind="source_transform", factory=partial(_int_embeddings, bits, 32),
            activation_bits=None, weight_bits=bits, per_channel=False,
            description=f"weight-only: int{bits} embedding tables in groups of 32, run by executorch's quantized "
            "embedding kernel on the CPU; linear layers stay float (torchao IntxWeightOnlyConfig)",
        )
