"""Hook implementations of the Samsung backend (hookimpls only)."""

from __future__ import annotations

import edgeplug
from edgeplug import BackendSpec, FusionPolicy, SkipDecomp

from edgeplug_samsung import support


@edgeplug.hookimpl
def edgeplug_backends():
    yield BackendSpec(
        backend="samsung",
        description="Samsung Exynos NPU through ENN",
        backend_id="EnnBackend",
        partitioner=support.make_partitioner,
        availability=support.availability,
    )


@edgeplug.hookimpl
def edgeplug_skip_decomp():
    yield SkipDecomp(backend="samsung", ops=support.skip_decomp_ops())


@edgeplug.hookimpl
def edgeplug_fusion_policies():
    yield FusionPolicy(
        backend="samsung",
        pattern="rms_norm",
        target="aten.rms_norm",
        weight_sources=frozenset({"leaf"}),
        fold_computed_constants=True,
        unit_weight_fallback=True,
        fp32_accumulation=False,
    )


@edgeplug.hookimpl
def edgeplug_passes():
    from edgeplug_samsung import passes

    yield edgeplug.PassSpec(backend="samsung", stage="export", name="decompose_roll", fn=passes.decompose_roll, order=10)
    yield edgeplug.PassSpec(backend="samsung", stage="export", name="decompose_remainder", fn=passes.decompose_remainder, order=20)
