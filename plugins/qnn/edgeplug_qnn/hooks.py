"""Hook implementations of the QNN backend (hookimpls only)."""

from __future__ import annotations

from edgeplug.plugin import BackendSpec, KeepWhole, PartitionerFilter, PassSpec, QuantScheme, aten_rms_norm_policy, hookimpl

from edgeplug_qnn import filters, support


@hookimpl
def edgeplug_backends():
    yield BackendSpec(
        backend="qnn",
        description="Qualcomm AI Engine Direct (QNN) for the Hexagon HTP",
        backend_id="QnnBackend",
        partitioner=support.make_partitioner,
        availability=support.availability,
        constant_only_policy=True,
        # EDGEPLUG_QNN_SAVER=1: every partition through QNN's saver (edgeplug_qnn.saver)
        lowering_context=support.lowering_context,
    )


@hookimpl
def edgeplug_keep_whole():
    yield KeepWhole(backend="qnn", ops=support.keep_whole_ops())


@hookimpl
def edgeplug_partitioner_filters():
    yield PartitionerFilter(backend="qnn", name=filters.NAME, fn=filters.constant_only)
    yield PartitionerFilter(backend="qnn", name=filters.RMS_NORM_NAME, fn=filters.rms_norm_one_axis)


@hookimpl
def edgeplug_fusion_policies():
    # aten.rms_norm kept whole (support.keep_whole_ops); HTP reads static quantized weights as they are
    yield aten_rms_norm_policy("qnn")


@hookimpl
def edgeplug_passes():
    from edgeplug_qnn import passes
    from edgeplug.plugin import rewrite_pass

    yield PassSpec(backend="qnn", stage="export", name="decompose_autocast", fn=passes.decompose_autocast, order=10)
    yield PassSpec(backend="qnn", stage="export", name="decompose_sdpa", fn=passes.decompose_sdpa, order=20)
    # the real flow removes layout-only copies before partitioning; so does ours (each one in the report)
    yield rewrite_pass("drop_identity_copies", backend="qnn")
    # QnnPartitioner has no builder for mul/add/sub/div.Scalar (the real flow lifts scalar operands
    # at export): as .Tensor ops with 0-d constants, QNN takes them (qwen3: 2 partitions -> 1)
    yield rewrite_pass("scalar_to_tensor", backend="qnn")


@hookimpl
def edgeplug_quantizers():
    from functools import partial

    from edgeplug_qnn.quantizers import qnn_quantizer

    # executorch's QnnQuantizer, per-channel linear/conv weights; building one never downloads the SDK
    for scheme, act, weight, what in (
        ("8a8w", 8, 8, "8-bit activations, 8-bit per-channel weights (QnnQuantizer; the HTP default)"),
        ("16a8w", 16, 8, "16-bit activations, 8-bit per-channel weights (QnnQuantizer; for accuracy-sensitive models)"),
        ("8a4w", 8, 4, "8-bit activations, 4-bit per-channel weights (QnnQuantizer; smallest weights)"),
        ("16a4w", 16, 4, "16-bit activations, 4-bit per-channel weights (QnnQuantizer; the LLM recipes' default)"),
    ):
        yield QuantScheme(
            backend="qnn", scheme=scheme, factory=partial(qnn_quantizer, scheme),
            activation_bits=act, weight_bits=weight, per_channel=True, description=what,
        )
