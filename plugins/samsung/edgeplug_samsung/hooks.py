"""Hook implementations of the Samsung backend (hookimpls only)."""

from __future__ import annotations

from edgeplug.plugin import BackendSpec, KeepWhole, PassSpec, QuantScheme, aten_rms_norm_policy, hookimpl

from edgeplug_samsung import support


@hookimpl
def edgeplug_backends():
    yield BackendSpec(
        backend="samsung",
        description="Samsung Exynos NPU through ENN",
        backend_id="EnnBackend",
        partitioner=support.make_partitioner,
        availability=support.availability,
    )


@hookimpl
def edgeplug_keep_whole():
    yield KeepWhole(backend="samsung", ops=support.keep_whole_ops())


@hookimpl
def edgeplug_fusion_policies():
    # aten.rms_norm kept whole (support.keep_whole_ops); ENN reads static quantized weights as they are.
    # ENN's RMSNORM and EnnQuantizer's annotator read argument 2 as a tensor: a norm without
    # a weight of its own (Mamba's norms of B, C and dt, F.rms_norm(x, shape), a norm fused
    # alone before a runtime scale) gets a constant ones([D]) in the norm's dtype, not None
    yield aten_rms_norm_policy("samsung", weightless="ones")


@hookimpl
def edgeplug_passes():
    from edgeplug_samsung import passes
    from edgeplug.plugin import rewrite_pass

    yield PassSpec(backend="samsung", stage="export", name="decompose_roll", fn=passes.decompose_roll, order=10)
    yield PassSpec(backend="samsung", stage="export", name="decompose_remainder", fn=passes.decompose_remainder, order=20)
    # the real flow removes layout-only copies before partitioning; so does ours (each one in the report)
    yield rewrite_pass("drop_identity_copies", backend="samsung")


def _enn_a8w8():
    from executorch.backends.samsung.quantizer import EnnQuantizer, Precision

    quantizer = EnnQuantizer()
    quantizer.setup_quant_params(Precision.A8W8, is_per_channel=True)
    return quantizer


@hookimpl
def edgeplug_quantizers():
    yield QuantScheme(
        backend="samsung", scheme="a8w8", factory=_enn_a8w8, activation_bits=8, weight_bits=8, per_channel=True,
        description="8-bit activations, 8-bit per-channel weights (EnnQuantizer)",
    )
