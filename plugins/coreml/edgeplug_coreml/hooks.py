"""Hook implementations of the Core ML backend (hookimpls only)."""

from __future__ import annotations

from edgeplug.plugin import BackendSpec, KeepWhole, PartitionerFilter, PassSpec, aten_rms_norm_policy, hookimpl

from edgeplug_coreml import support


@hookimpl
def edgeplug_backends():
    yield BackendSpec(
        backend="coreml",
        description="Apple Core ML (CPU, GPU and Neural Engine), fp16, iOS 18 and later",
        backend_id=support.BACKEND_ID,
        partitioner=support.make_partitioner,
        availability=support.availability,
        # no Core ML runtime off Apple platforms: the .pte cannot run here
        verify_method="none",
        lowering_context=support.quiet_coreml,
    )


@hookimpl
def edgeplug_keep_whole():
    yield KeepWhole(backend="coreml", ops=support.keep_whole_ops())


@hookimpl
def edgeplug_partitioner_filters():
    yield PartitionerFilter(backend="coreml", name=support.DTYPE_FILTER, fn=support.refuse_dtypes_coreml_lacks)
    yield PartitionerFilter(backend="coreml", name=support.SYMBOLIC_FILTER, fn=support.refuse_data_dependent_scalars)


@hookimpl
def edgeplug_passes():
    from edgeplug_coreml import passes

    yield PassSpec(backend="coreml", stage="export", name="positive_cumsum_dims", fn=passes.positive_cumsum_dims, order=10)


@hookimpl
def edgeplug_fusion_policies():
    # coremltools converts aten.rms_norm to one MIL op; Core ML takes its weight as a constant of shape [D],
    # and a PT2E-quantized weight reaches coremltools as dequantize(constant), which it reads
    yield aten_rms_norm_policy("coreml")
