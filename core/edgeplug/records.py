"""The records hooks return.

Every record names the backend it is for, so one plugin may add to a backend
another plugin registered. Records are pydantic models: the plugin manager
validates whatever a hook yields and reports the plugin when it is invalid.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: Plugin API versions this core accepts in ``BackendSpec.api_version``.
API_VERSION = 1
SUPPORTED_API_VERSIONS = (1,)

_NAME = re.compile(r"^[a-z][a-z0-9_\-]*$")


def _backend_name(value: str) -> str:
    value = value.strip().lower()
    if not _NAME.match(value):
        raise ValueError(
            f"backend name {value!r} must be lower-case letters, digits, '-' or '_', "
            "starting with a letter"
        )
    return value


class _Record(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True, extra="forbid")

    backend: str

    @field_validator("backend")
    @classmethod
    def _check_backend(cls, v: str) -> str:
        return _backend_name(v)


class Availability(BaseModel):
    """Whether a backend's delegate can be serialized on this machine."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    reason: str = ""
    #: What the user should do to make it available (e.g. set QNN_SDK_ROOT).
    hint: str = ""


class BackendSpec(_Record):
    """A backend: how to partition for it and whether it can serialize here."""

    description: str
    #: ExecuTorch's backend id (the name a delegate carries in the .pte).
    backend_id: str
    #: Returns a fresh executorch ``Partitioner`` for this backend.
    partitioner: Callable[[], Any]
    #: Returns an ``Availability``; called lazily, must not raise.
    availability: Callable[[], Availability] = Field(
        default=lambda: Availability(ok=True)
    )
    api_version: int = API_VERSION
    #: How ``verify`` runs a lowered program: execute the real .pte with
    #: executorch's runtime ("pte"), run delegates with registered kernels on
    #: the host ("kernels"), or not at all ("none").
    verify: Literal["pte", "kernels", "none"] = "none"
    #: HTP-like hardware: partitions that read no runtime input are refused,
    #: kept-whole ops inside constant-only subgraphs are decomposed.
    constant_only_policy: bool = False
    #: Returns a context manager the core enters around partitioning and the
    #: delegate's preprocess (e.g. to keep executorch's own fusions out).
    #: It must restore whatever it changes on exit, errors included.
    lowering_context: Optional[Callable[[], Any]] = None
    #: The backend's per-node support check, for a partitioner ``partitioner()``
    #: made: ``support_check(partitioner, graph_module_or_None)`` returns
    #: ``check(node)``, answering an ``edgeplug.partition.Verdict`` (``Verdict(False,
    #: reason)`` to refuse with a reason) or a bool, for aten and edge nodes.
    #: The core asks it which kept-whole ops stay whole, why a node stays on
    #: the CPU, and whether a fused op would be delegated. None: the core
    #: learns support only from what the partitioner tags.
    support_check: Optional[Callable[[Any, Any], Callable[[Any], Any]]] = None

    @field_validator("api_version")
    @classmethod
    def _check_api(cls, v: int) -> int:
        if v not in SUPPORTED_API_VERSIONS:
            raise ValueError(
                f"plugin API version {v} is not supported by this edgeplug "
                f"(supported: {', '.join(map(str, SUPPORTED_API_VERSIONS))}); "
                "install a plugin release built for this core, or upgrade edgeplug"
            )
        return v


class SkipDecomp(_Record):
    """Operators the backend keeps whole (not decomposed by to_edge)."""

    ops: tuple[Any, ...]

    @field_validator("ops")
    @classmethod
    def _check_ops(cls, ops: tuple[Any, ...]) -> tuple[Any, ...]:
        import torch

        for op in ops:
            if not isinstance(op, torch._ops.OpOverload):
                raise ValueError(
                    f"{op!r} is not an operator overload (use e.g. "
                    "torch.ops.aten.linear.default, not torch.ops.aten.linear)"
                )
        return tuple(ops)


Stage = Literal["before_decomposition", "partition", "after_lowering"]


class PartitionerFilter(_Record):
    """Decides, for a kept-whole node, whether it really stays whole.

    ``fn(node, ctx)`` returns True (keep whole), False (decompose) or None
    (no opinion). ``ctx`` is a ``edgeplug.partition.FilterContext``.
    """

    name: str
    fn: Callable[[Any, Any], Optional[bool]]


WeightSource = Literal["leaf", "computed", "runtime"]


class FusionPolicy(_Record):
    """What a matched pattern becomes on this backend."""

    pattern: Literal["rms_norm"] = "rms_norm"
    #: The fused operator, e.g. "aten.rms_norm" or "et_vk.rms_norm".
    target: str
    #: Weight sources the fused op may take directly.
    weight_sources: frozenset[WeightSource] = frozenset({"leaf"})
    #: Fold computed constant weights (Gemma's 1 + w) into a new constant.
    fold_computed_constants: bool = True
    #: For a runtime weight: fuse the norm with a unit weight, keep the multiply.
    unit_weight_fallback: bool = True
    #: The fused kernel accumulates in fp32 whatever the storage dtype.
    fp32_accumulation: bool = False


class Kernel(_Record):
    """A runtime kernel for one op of one backend (host verification, benchmarks)."""

    op: str
    impl: Callable[..., Any]
    device: Literal["wgpu", "cpu"] = "wgpu"
    #: Validates arguments before dispatch; raises with a clear message.
    checks: Optional[Callable[..., None]] = None


class PassSpec(_Record):
    """A backend pass. ``fn(ep) -> ExportedProgram | None`` (None: changed in place)."""

    stage: Literal["export", "edge"]
    name: str
    fn: Callable[[Any], Any]
    order: int = 0


_SCHEME = re.compile(r"^[a-z0-9][a-z0-9_\-]*$")


class QuantScheme(_Record):
    """A PT2E quantization scheme of a backend, for ``edgeplug.quantize`` and ``lower --quantize``.

    ``factory()`` returns a fresh, configured torchao ``Quantizer``
    (executorch's ``QnnQuantizer``, ``XNNPACKQuantizer``, ...); building it
    must not reach the network. The other fields say what the scheme means.
    """

    #: the name users pass (``--quantize 8a8w``), lower-case
    scheme: str
    factory: Callable[[], Any]
    #: bits of the quantized activations; None: weight-only (activations stay float)
    activation_bits: Optional[int]
    weight_bits: int
    #: weights quantized per output channel (else per tensor)
    per_channel: bool
    description: str

    @field_validator("scheme")
    @classmethod
    def _check_scheme(cls, v: str) -> str:
        v = v.strip().lower()
        if not _SCHEME.match(v):
            raise ValueError(f"scheme name {v!r} must be lower-case letters, digits, '-' or '_'")
        return v


FusionOutcome = Literal["fused", "fused_unit_weight", "folded_weight", "rejected"]


class FusionRecord(BaseModel):
    """One match of a pattern and what became of it."""

    model_config = ConfigDict(frozen=True)

    pattern: str
    anchor: str
    outcome: FusionOutcome
    reason: str = ""
    eps: Optional[float] = None
    weight: Optional[str] = None


#: hook name -> the record type it yields
HOOK_RECORDS: dict[str, type[BaseModel]] = {
    "edgeplug_backends": BackendSpec,
    "edgeplug_skip_decomp": SkipDecomp,
    "edgeplug_partitioner_filters": PartitionerFilter,
    "edgeplug_fusion_policies": FusionPolicy,
    "edgeplug_kernels": Kernel,
    "edgeplug_passes": PassSpec,
    "edgeplug_quantizers": QuantScheme,
}
