"""What the QNN backend declares without the SDK: its SDK check and support table."""

from __future__ import annotations

import contextlib
import functools
import os
import re
from pathlib import Path
from typing import Iterator, Optional

from edgeplug.plugin import Availability, BackendUnavailableError
from edgeplug_qnn import saver
from edgeplug_qnn.saver import SDK_VAR, not_a_folder

SOC_VAR = "EDGEPLUG_QNN_SOC"  # e.g. SM8650; which HTP to compile for
DEFAULT_SOC = "SM8650"


def availability() -> Availability:
    if saver.enabled():  # the saver mode needs the libraries loadable, not a device
        return saver.availability()
    root = os.environ.get(SDK_VAR)
    hint = (
        f"Install the Qualcomm AI Engine Direct (QNN) SDK and set {SDK_VAR} to its root "
        f"(the folder holding lib/x86_64-linux-clang/libQnnHtp.so)"
    )
    if not root:
        return Availability(ok=False, reason=f"the QNN SDK is not configured ({SDK_VAR} is not set)", hint=hint)
    if not Path(root).is_dir():
        return Availability(ok=False, reason=f"{SDK_VAR}={root} {not_a_folder(root)}", hint=hint)
    lib = Path(root) / "lib" / "x86_64-linux-clang" / "libQnnHtp.so"
    if not lib.is_file():
        return Availability(ok=False, reason=f"{SDK_VAR}={root} has no lib/x86_64-linux-clang/libQnnHtp.so", hint=hint)
    for name in ("libQnnHtp.so", "libQnnSystem.so"):  # what executorch's QNN wrapper loads, with their dependencies
        path = lib.parent / name
        if not path.is_file():
            continue
        failed = _load_error(path)
        if failed:
            return Availability(
                ok=False,
                reason=f"{SDK_VAR}={root}: {name} is there but does not load ({failed})",
                hint=f"add {lib.parent} to LD_LIBRARY_PATH (its libraries load one another from there), "
                "or install the SDK's missing dependency",
            )
    found, expected = qnn_release(lib), expected_qnn_release()
    if found and expected and found.split(".")[:2] != expected.split(".")[:2]:
        # the device cannot be created with them (seen: QNN 2.47 and 2.51 under ExecuTorch 1.5.1, built for 2.37)
        return Availability(ok=False, reason=_wrong_release(root, found, expected), hint=_without_the_device(expected))
    return Availability(ok=True)


#: the QNN SDK release (major.minor) each ExecuTorch release (major.minor) is built against: its QNN
#: adaptor creates the HTP device with that release's libraries only (ExecuTorch 1.5's build of QNN 2.37
#: fails on 2.47 and 2.51 with "unknown custom config socModel")
BUILT_AGAINST = {"1.5": "2.37"}
#: how QNN's libraries name their release: "AISW_VERSION: 2.51.0", or the build tag "v2.51.0.260929181845"
_RELEASE = (re.compile(rb"AISW_VERSION: (\d+\.\d+\.\d+)"), re.compile(rb"\bv(\d+\.\d+\.\d+)\.\d{6,}\b"))


def qnn_release(lib: Path) -> Optional[str]:
    """The QNN SDK release a QNN library is from (``"2.51.0"``), read from the version text it carries; None if it has none."""
    try:
        st = lib.stat()
    except OSError:
        return None
    return _release_of(str(lib), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _release_of(path: str, _mtime: int, _size: int) -> Optional[str]:
    import mmap

    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for pattern in _RELEASE:
                m = pattern.search(data)
                if m:
                    return m.group(1).decode()
    except (OSError, ValueError):
        return None
    return None


def executorch_release() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("executorch")
    except PackageNotFoundError:
        return ""


def expected_qnn_release() -> Optional[str]:
    """The QNN release the installed ExecuTorch is built against (``"2.37"``), where edgeplug knows it."""
    return BUILT_AGAINST.get(".".join(executorch_release().split(".")[:2]))


def _wrong_release(root: str, found: str, expected: str) -> str:
    return (
        f"{SDK_VAR}={root} holds QNN {found} (lib/x86_64-linux-clang/libQnnHtp.so), but ExecuTorch "
        f"{executorch_release()} is built against QNN {expected}: it cannot create the HTP device with these "
        "libraries. The environment is at fault, not the model or ExecuTorch"
    )


def _without_the_device(expected: Optional[str]) -> str:
    sdk = f"the QNN {expected} SDK" if expected else "the QNN SDK release ExecuTorch is built against"
    return (
        f"Install {sdk} and set {SDK_VAR} to its root; or, without a device: "
        f"`EDGEPLUG_QNN_SAVER=1 edgeplug lower MODEL --backend qnn` (these libraries, every partition through "
        "QNN's saver) or `edgeplug lower MODEL --backend qnn --dry-run` (the support table, no QNN library)"
    )


#: what ExecuTorch's QNN adaptor raises when the HTP device cannot be made with the libraries it loaded
_NO_DEVICE = ("Failed to initialize QNN backend", "Fail to configure Qnn device", "Failed to create device_handle")


@contextlib.contextmanager
def device_failure_named() -> Iterator[None]:
    """A failure to create the HTP device (libraries present, of a release ExecuTorch cannot use) is the
    environment's: ``BackendUnavailableError`` naming the library, its release, the one expected and the
    commands that work, instead of ExecuTorch's own error blamed on ExecuTorch."""
    try:
        yield
    except Exception as exc:
        chain: list[BaseException] = []
        cur: Optional[BaseException] = exc
        while cur is not None and cur not in chain:
            chain.append(cur)
            cur = cur.__cause__ or cur.__context__
        if not any(marker in str(e) for e in chain for marker in _NO_DEVICE):
            raise
        root = os.environ.get(SDK_VAR, "")
        lib = Path(root) / "lib" / "x86_64-linux-clang" / "libQnnHtp.so"
        found, expected = qnn_release(lib), expected_qnn_release()
        raise BackendUnavailableError(
            f"QNN could not create the HTP device with {lib} (QNN {found or 'of a release it does not name'}); "
            f"ExecuTorch {executorch_release()} is built against QNN {expected or 'another release'}. The environment "
            f"is at fault, not the model or ExecuTorch. {_without_the_device(expected)}"
        ) from exc


def _load_error(path: Path) -> str:
    """Why the dynamic loader refuses ``path`` (every dependency resolved now), or "" when it loads."""
    import ctypes

    try:
        ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        return str(exc)
    return ""


def supported_ops():
    """Edge (aten) ops the HTP support table declares, for SDK-free partitioning.

    What executorch's QNN op builders take (executorch/backends/qualcomm/builders),
    for the ops our examples and quantized programs meet. Copies the real flow
    removes before partitioning (``_clone_dim_order``, ``alias_copy``) are not
    here: the plugin's edge pass removes them, as QNN's does.
    """
    import torch

    a = torch.ops.aten
    return [
        a.add.Tensor, a.sub.Tensor, a.mul.Tensor, a.div.Tensor, a.neg.default,
        a.add.Scalar, a.sub.Scalar, a.mul.Scalar, a.div.Scalar,
        a.rsqrt.default, a.sqrt.default, a.pow.Tensor_Scalar, a.exp.default,
        a.mean.dim, a.sum.dim_IntList, a.amax.default,
        a.linear.default, a.addmm.default, a.mm.default, a.bmm.default,
        a.permute_copy.default, a.view_copy.default, a.expand_copy.default,
        a.squeeze_copy.dims, a.unsqueeze_copy.default, a.slice_copy.Tensor,
        a.select_copy.int, a.cat.default, a.clone.default, a._to_copy.default,
        a._softmax.default, a.sigmoid.default, a.tanh.default, a.relu.default,
        a.gelu.default, a.hardswish.default, a.hardsigmoid.default,
        a.rms_norm.default, a.native_layer_norm.default, a.embedding.default,
        a.where.self, a.full_like.default, a.constant_pad_nd.default,
        a.convolution.default, a.avg_pool2d.default, a.max_pool2d_with_indices.default,
        # batch norm as to_edge leaves it (inference), relu6 and clamps
        a._native_batch_norm_legit_no_training.default, a.hardtanh.default, a.clamp.default,
        *_quant_ops(),
        *_group_quant_ops(),
    ]


#: Tensor dtypes HTP takes: float and the integer types of its quantized
#: encodings (8 and 16 bits, signed or not; int32 biases), bool, int64 indices.
DTYPES = (
    "float32", "float16", "bool", "int64", "int32", "int16", "uint16", "int8", "uint8",
)


def dtypes():
    import torch

    return tuple(getattr(torch, d) for d in DTYPES)


def _quant_ops():
    """Per-tensor and per-channel quantize/dequantize: QNN turns them into tensor encodings."""
    import torch
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    q = torch.ops.quantized_decomposed
    return (
        q.quantize_per_tensor.default, q.dequantize_per_tensor.default, q.dequantize_per_tensor.tensor,
        q.quantize_per_channel.default, q.dequantize_per_channel.default,
    )


def _group_quant_ops():
    """Group-wise weight quantize/dequantize: QNN builds per-block encodings from them."""
    import torch
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    q = torch.ops.quantized_decomposed
    return (q.quantize_per_channel_group.default, q.dequantize_per_channel_group.default)


def keep_whole_ops():
    """Ops HTP keeps whole (it has a native op for each)."""
    import torch

    a = torch.ops.aten
    return (
        a.linear.default, a.hardswish.default, a.hardsigmoid.default, a.rms_norm.default,
        a.instance_norm.default, a.pixel_shuffle.default, a.pixel_unshuffle.default,
        a.leaky_relu.default, a.prelu.default, a.elu.default, a.matmul.default,
        *_group_quant_ops(),
    )


def soc():
    """The ``QcomChipset`` to compile for (``EDGEPLUG_QNN_SOC``, default SM8650)."""
    from edgeplug_qnn._executorch import ensure_qualcomm_importable

    ensure_qualcomm_importable()  # 1.4 downloads the QNN SDK at import: not here
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset

    name = os.environ.get(SOC_VAR, DEFAULT_SOC).upper()
    if not hasattr(QcomChipset, name):
        known = ", ".join(c.name for c in QcomChipset)
        raise ValueError(f"{SOC_VAR}={name} names no Qualcomm SoC ExecuTorch knows; use one of {known}")
    return getattr(QcomChipset, name)


def make_partitioner():
    from edgeplug.plugin import SupportTablePartitioner

    chip = soc()  # an unknown SoC is the user's mistake, with or without the SDK (a dry run for it means nothing)
    if availability().ok:  # the real partitioner, with compile specs for the chosen SoC
        from edgeplug_qnn._executorch import ensure_qualcomm_importable

        ensure_qualcomm_importable()  # 1.4 downloads the QNN SDK at import: not here
        from executorch.backends.qualcomm.partition.qnn_partitioner import QnnPartitioner
        from executorch.backends.qualcomm.utils.utils import (
            generate_htp_compiler_spec,
            generate_qnn_executorch_compiler_spec,
        )

        if saver.enabled():  # QNN's saver records each partition instead of compiling it
            return QnnPartitioner(saver.compile_specs(chip))
        specs = generate_qnn_executorch_compiler_spec(soc_model=chip, backend_options=generate_htp_compiler_spec(use_fp16=True))
        return QnnPartitioner(specs)
    return SupportTablePartitioner(
        "QnnBackend", supported_ops(), keep_whole=keep_whole_ops(), dtypes=dtypes(), name="QNN (HTP)"
    )


def lowering_context():
    """Around partitioning and preprocess: in the saver mode, each partition recorded by QNN's saver; with
    the device's partitioner, a device QNN cannot create named as the environment's fault."""
    if saver.enabled() and saver.availability().ok:
        return saver.per_partition_saver(saver.compile_specs(soc()))
    if not saver.enabled() and availability().ok:  # the real partitioner: it creates the HTP device
        return device_failure_named()
    return contextlib.nullcontext()
