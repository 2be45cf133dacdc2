"""Hook implementations of the WebGPU backend (hookimpls only).

WebGPU serializes through executorch's Vulkan delegate, so it yields the
records every such backend shares (``edgeplug_vulkan_delegate``) under its own
name, with its own partitioner and kernels.
"""

from __future__ import annotations

from edgeplug.plugin import Availability, Kernel, PartitionerFilter, executorch_has, hookimpl

from edgeplug_vulkan_delegate import fusion, records, rewrites
from edgeplug_vulkan_delegate.runtime import webgpu_device_runtime
from edgeplug_webgpu import runtime_gaps, runtime_ops

BACKEND = "webgpu"


_PARTITIONER = ("executorch.backends.webgpu.partitioner", "WebGPUPartitioner")
_NEEDS = "the webgpu backend (ExecuTorch's WebGPU partitioner)"


def _partitioner():
    from edgeplug.plugin import executorch_feature

    # as ExecuTorch's own WebGPU flow builds it: only the ops the targeted runtime implements, the list decided
    # here once for the lowering (the support check and the report's note read it: edgeplug_webgpu.runtime_ops)
    ops = runtime_ops.targeted_list()
    options, allowlist = runtime_ops.partitioner_options(ops)
    made = executorch_feature(*_PARTITIONER, needed_for=_NEEDS, since="1.5")(options, operator_allowlist=allowlist)
    return runtime_ops.remember(made, ops)


def _availability() -> Availability:
    """WebGPUPartitioner is new in ExecuTorch 1.5: on 1.4 nothing of this backend can run, dry runs included; nor
    where the found runtime build's op list cannot be read (which ops to delegate is unknown)."""
    if not executorch_has(*_PARTITIONER):
        from edgeplug.plugin import lacks_executorch_feature

        return Availability(
            ok=False, reason=str(lacks_executorch_feature("WebGPUPartitioner", _NEEDS, since="1.5")),
            hint="pip install 'executorch>=1.5,<1.6'", dry_run=False,
        )
    problem = runtime_ops.list_file_problem()
    if problem:
        return Availability(ok=False, reason=problem, dry_run=False)
    return Availability(ok=True)


@hookimpl
def edgeplug_backends():
    yield records.backend_spec(
        BACKEND, description="ExecuTorch WebGPU delegate (shares the Vulkan serialization)", partitioner=_partitioner,
        availability=_availability,
        device_runtime=webgpu_device_runtime,  # ExecuTorch's own WebGPU runtime on wgpu-native, where it is built here
    ).model_copy(update={  # only what the WebGPU runtime implements, and the report says whose list that is
        "support_check": runtime_ops.support_check, "support_note": runtime_ops.support_note,
    })


@hookimpl
def edgeplug_partitioner_filters():
    # what ExecuTorch's WebGPU runtime refuses at load among the ops it lists (found running programs in it)
    yield PartitionerFilter(backend=BACKEND, name=runtime_gaps.NAME, fn=runtime_gaps.conversion_gaps)
    yield PartitionerFilter(backend=BACKEND, name=runtime_gaps.INT8_NAME, fn=runtime_gaps.int8_matmul_weight)
    yield PartitionerFilter(backend=BACKEND, name=runtime_gaps.REDUCE_NAME, fn=runtime_gaps.reduction_gaps)
    yield PartitionerFilter(backend=BACKEND, name=runtime_gaps.EXPAND_NAME, fn=runtime_gaps.expand_inferred_sizes)


@hookimpl
def edgeplug_keep_whole():
    yield records.keep_whole(BACKEND)


@hookimpl
def edgeplug_passes():
    yield from rewrites.canonical_rewrites(BACKEND)


@hookimpl
def edgeplug_fusion_policies():
    # our WGSL kernel accumulates in fp32 whatever the storage dtype
    yield fusion.rms_norm_policy(BACKEND, fp32_accumulation=True)


@hookimpl
def edgeplug_kernels():
    # WGSL, run through wgpu; needs torch, numpy and wgpu only
    from edgeplug_webgpu.kernels import check_rms_norm, rms_norm

    yield Kernel(backend=BACKEND, op="et_vk.rms_norm.default", impl=rms_norm, device="wgpu", checks=check_rms_norm)


@hookimpl
def edgeplug_quantizers():
    # WebGPU shares Vulkan's partitioner and serialization, so Vulkan's quantizer
    yield from records.weight_only_schemes(BACKEND)
