"""What the Samsung backend declares without the SDK: its SDK check and support table."""

from __future__ import annotations

import os
from pathlib import Path

from edgeplug.plugin import Availability

SDK_VAR = "EXYNOS_AI_LITECORE_ROOT"
CHIPSET_VAR = "EDGEPLUG_SAMSUNG_CHIPSET"  # e.g. E9955
DEFAULT_CHIPSET = "E9955"


def availability() -> Availability:
    root = os.environ.get(SDK_VAR)
    hint = f"Install Samsung's Exynos AI LiteCore SDK and set {SDK_VAR} to its root"
    if not root:
        return Availability(ok=False, reason=f"the Exynos AI LiteCore SDK is not configured ({SDK_VAR} is not set)", hint=hint)
    if not Path(root).is_dir():
        return Availability(ok=False, reason=f"{SDK_VAR}={root} is not a folder", hint=hint)
    for path in sorted(Path(root).glob("lib*/**/*.so")):  # the SDK's libraries, with their dependencies
        failed = _load_error(path)
        if failed:
            return Availability(
                ok=False,
                reason=f"{SDK_VAR}={root}: {path.name} is there but does not load ({failed})",
                hint=f"add {path.parent} to LD_LIBRARY_PATH (the SDK's libraries load one another from there), "
                "or install the missing dependency",
            )
    try:
        import executorch.backends.samsung.python.PyEnnWrapperAdaptor  # noqa: F401
    except ImportError as exc:
        return Availability(
            ok=False,
            reason=f"executorch's ENN wrapper is not built ({exc})",
            hint="build executorch with the Samsung backend enabled against the SDK",
        )
    return Availability(ok=True)


def _load_error(path: Path) -> str:
    """Why the dynamic loader refuses ``path`` (every dependency resolved now), or "" when it loads."""
    import ctypes

    try:
        ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        return str(exc)
    return ""


def supported_ops():
    """Edge (aten) ops the ENN support table declares, for SDK-free partitioning.

    What executorch's Samsung op builders take (executorch/backends/samsung/builders),
    for the ops our examples and quantized programs meet; layout-only copies
    are removed by the plugin's edge pass instead.
    """
    import torch

    a = torch.ops.aten
    return [
        a.add.Tensor, a.sub.Tensor, a.mul.Tensor, a.div.Tensor, a.neg.default,
        a.add.Scalar, a.sub.Scalar, a.mul.Scalar, a.div.Scalar,
        a.rsqrt.default, a.sqrt.default, a.pow.Tensor_Scalar, a.exp.default,
        a.mean.dim, a.amax.default, a.linear.default, a.addmm.default, a.mm.default,
        a.bmm.default, a.permute_copy.default, a.view_copy.default, a.expand_copy.default,
        a.squeeze_copy.dims, a.unsqueeze_copy.default, a.slice_copy.Tensor,
        a.select_copy.int, a.cat.default, a.clone.default, a._softmax.default,
        a.sigmoid.default, a.tanh.default, a.relu.default, a.gelu.default,
        a.hardswish.default, a.rms_norm.default, a.native_layer_norm.default,
        a.embedding.default, a.constant_pad_nd.default, a.convolution.default,
        a.avg_pool2d.default, a.max_pool2d_with_indices.default,
        # batch norm as to_edge leaves it (inference), relu6 and clamps
        a._native_batch_norm_legit_no_training.default, a.hardtanh.default, a.clamp.default,
        *_quant_ops(),
    ]


#: Tensor dtypes ENN takes: float, and the 8-bit integers of its a8w8 scheme.
DTYPES = ("float32", "float16", "bool", "int64", "int32", "int8", "uint8")


def dtypes():
    import torch

    return tuple(getattr(torch, d) for d in DTYPES)


def _quant_ops():
    """Per-tensor and per-channel quantize/dequantize (ENN's quantize/dequantize builders)."""
    import torch
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    q = torch.ops.quantized_decomposed
    return (
        q.quantize_per_tensor.default, q.dequantize_per_tensor.default, q.dequantize_per_tensor.tensor,
        q.quantize_per_channel.default, q.dequantize_per_channel.default,
    )


def keep_whole_ops():
    import torch

    a = torch.ops.aten
    return (a.linear.default, a.hardswish.default, a.rms_norm.default, a.pixel_shuffle.default)


def make_partitioner():
    from edgeplug.plugin import SupportTablePartitioner

    if availability().ok:
        from executorch.backends.samsung.partition.enn_partitioner import EnnPartitioner
        from executorch.backends.samsung.serialization.compile_options import gen_samsung_backend_compile_spec

        chipset = os.environ.get(CHIPSET_VAR, DEFAULT_CHIPSET)
        return EnnPartitioner([gen_samsung_backend_compile_spec(chipset)])
    return SupportTablePartitioner("EnnBackend", supported_ops(), keep_whole=keep_whole_ops(), dtypes=dtypes())
