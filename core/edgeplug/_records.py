"""The records hooks return.

Every record names the backend it is for, so one plugin may add to a backend
another plugin registered. Records are pydantic models: the plugin manager
validates whatever a hook yields and reports the plugin when it is invalid.

Vocabulary (used the same way by hooks, records, ``Backend``, the partitioner
and the report):

- **keep whole**: an op ``to_edge`` must not decompose because the backend
  runs it as one op (``KeepWhole`` records, ``Backend.keep_whole``; the report's
  ``kept_whole_on_cpu`` lists kept-whole ops that stayed on the CPU and
  ``decomposed_instead`` those the backend refused, so they were decomposed).
- **verify**: ``edgeplug.verify(result, backend)`` runs a lowered program and
  compares it with eager; ``lower(..., verify=True)`` calls it;
  ``BackendSpec.verify_method`` says how it runs for a backend (``"pte"``,
  ``"kernels"`` or ``"none"``), and the report's ``verification.method``
  says which method ran.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Callable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: The plugin API version this core speaks (``BackendSpec.api_version``); the
#: registry checks the API a plugin wants and the renames it uses (docs/plugin-api-changes.md lists them).
from edgeplug import _api
from edgeplug._api import API_VERSION

#: How ``edgeplug.verify`` runs a backend's lowered programs (``BackendSpec.verify_method``).
VerifyMethod = Literal["pte", "kernels", "none"]

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
    #: Whether a dry run can still partition here (False where the partitioner itself is missing, e.g. an
    #: ExecuTorch release without it): then every lowering is refused before any work, dry runs included.
    dry_run: bool = True


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
    #: How ``edgeplug.verify`` runs a lowered program: execute the real .pte
    #: with executorch's runtime ("pte"), run delegates with registered kernels
    #: on the host ("kernels"), or not at all ("none").
    verify_method: VerifyMethod = "none"
    #: HTP-like hardware: partitions that read no runtime input are refused,
    #: kept-whole ops inside constant-only subgraphs are decomposed.
    constant_only_policy: bool = False
    #: Returns a context manager the core enters around partitioning and the
    #: delegate's preprocess (e.g. to keep executorch's own fusions out).
    #: It must restore whatever it changes on exit, errors included.
    lowering_context: Optional[Callable[[], Any]] = None
    #: The backend's per-node support check, for a partitioner ``partitioner()``
    #: made: ``support_check(partitioner, graph_module_or_None)`` returns
    #: ``check(node)``, answering an ``edgeplug.plugin.Verdict`` (``refuse(reason)``
    #: to refuse with a reason) or a bool, for aten and edge nodes. A factory
    #: with a ``program`` parameter is also given the edge program being
    #: partitioned (``program=``; None before decomposition and for fusion
    #: probes), for a backend checker built over the program that records why.
    #: The core asks it which kept-whole ops stay whole, why a node stays on
    #: the CPU, and whether a fused op would be delegated. None: the core
    #: learns support only from what the partitioner tags.
    support_check: Optional[Callable[[Any, Any], Callable[[Any], Any]]] = None
    #: For host verification (``verify_method="kernels"``): what the delegate's
    #: preprocess does to constants before it stores them (e.g. batch norms
    #: folded into a convolution, zero points dropped).
    #: ``delegate_constants(original_program, named_data)`` returns an object
    #: with ``graph_module`` (the graph to interpret), ``resolve(name, tensor)``
    #: (``(key or None, value, what)`` for a constant the named data lacks, or
    #: None), ``counts`` (a Counter of what each rule did) and ``read`` (how
    #: many constants it read from named data). None: constants are stored as
    #: the graph holds them.
    delegate_constants: Optional[Callable[[Any, Any], Any]] = None
    #: Constant folding (the core's, before partitioning): the largest constant, in
    #: bytes, that folding a constant-only subgraph may create for this
    #: backend; 0 turns the core's constant folding off.
    constant_fold_budget: int = Field(default=1 << 20, ge=0)
    #: The delegate's preprocess stores weights in executorch's named data
    #: (untagged, or under the ``meta["custom"]["delegate_constant_tag"]`` of
    #: the weight's placeholder), so external weights (``lower(...,
    #: external_weights=True)``) can put them into a ``.ptd`` beside the
    #: ``.pte``. False: the backend refuses external weights before any work.
    external_weights: bool = False
    #: The backend's own runtime, built for this host (e.g. ExecuTorch's
    #: Vulkan runtime built from source): ``device_runtime()`` returns an
    #: object with ``name`` (e.g. "ExecuTorch Vulkan runtime cff6f4d") and
    #: ``run(pte, data, calls)`` -> ``(outputs_per_call, adapter)``, which
    #: loads the ``.pte`` (and its ``.ptd`` bytes, or None) once and calls its
    #: method on each of ``calls`` (flat inputs in the program's order),
    #: keeping the program's buffers between calls; it raises
    #: ``RuntimeRefusedError`` with the runtime's own message when the runtime
    #: refuses. It may also have ``open(pte, data)``, answering an object with
    #: ``run(inputs)`` (one call's outputs), ``adapter`` and ``close()``, the
    #: program loaded once: greedy generation (``verify_steps``) needs it, as
    #: each call's input is the token the call before chose.
    #: ``device_runtime()`` raises ``RuntimeNotFound`` (saying how to
    #: get one) when none is on this machine. Verification runs the ``.pte``
    #: through it when it is found (method "pte", the adapter naming the
    #: runtime) and by ``verify_method`` otherwise, the note saying why.
    device_runtime: Optional[Callable[[], Any]] = None
    #: A buffer the program writes (a KV cache) may be moved into the
    #: delegate that reads and writes it (executorch's ``tag_mutated_buffer``).
    #: False: every such buffer stays a program input, its new value a
    #: delegate output the program writes back (for a runtime that does not
    #: keep a delegate's buffers: ExecuTorch's Vulkan backend).
    delegate_buffers: bool = True
    #: A constant that several partitions read (a tied embedding table and
    #: ``lm_head``), or a partition and the CPU, is given to each partition as
    #: its own copy (its storage shared while lowering) instead of staying a
    #: program input each delegate call is handed, as stock ExecuTorch does:
    #: most delegates build a weight from constant data only (ExecuTorch's
    #: Vulkan runtime, TOSA's "unsupported param type"). False: such a constant
    #: stays one program input, for a runtime that takes shared weights as
    #: inputs (and saves the copy in a .pte whose delegate stores by position).
    copy_shared_constants: bool = True
    #: Returns a fresh stock ExecuTorch ``Partitioner`` to compare with
    #: (``--compare-stock``, the zoo's stock column): for a backend whose own
    #: partitioner subclasses or wraps ExecuTorch's, the plain one, built as a
    #: user of ExecuTorch would. None: the backend's partitioner itself where it
    #: is an ExecuTorch class (its module under ``executorch.``), else no stock flow.
    stock_partitioner: Optional[Callable[[], Any]] = None
    #: A sentence saying what decides which ops the backend takes, where that depends on the machine (e.g. the
    #: op list of the runtime the program targets, found here, or a release's list when none is):
    #: ``support_note(partitioner)`` is given the partitioner a lowering made, and the report carries its answer
    #: as a note; given None, it says what a lowering would use now (``edgeplug backends`` prints it, and must
    #: stay fast: do not import executorch for it). None: the backend has nothing to say.
    support_note: Optional[Callable[[Any], str]] = None

    @model_validator(mode="before")
    @classmethod
    def _old_spellings(cls, data: Any) -> Any:
        # a keyword of the previous plugin API (edgeplug._api.RENAMES): warned, or refused naming the new one
        if not isinstance(data, dict):
            return data

        for old, rename in _api.field_renames("BackendSpec").items():
            if old not in data:
                continue
            new = _api.new_field_name(rename)
            if new in data:
                raise ValueError(f"give {new} only ({old} is its old name: {rename.sentence()})")
            try:
                _api.used(rename.old)
            except _api.RemovedSpelling as exc:  # outside a plugin's loading: the record is invalid
                raise ValueError(str(exc)) from None
            data = {**data, new: data[old]}
            del data[old]
        return data

    @model_validator(mode="after")
    def _one_truth_about_verification(self) -> "BackendSpec":
        # with a runtime of its own, verification runs there where it is built, so "none" would be refused
        # by --verify while `edgeplug backends` says the runtime runs it: say what runs it elsewhere instead
        if self.device_runtime is not None and self.verify_method == "none":
            raise ValueError(
                "device_runtime is given with verify_method 'none': --verify runs the .pte in the device runtime "
                "where it is found, and verify_method says what runs it where it is not: 'pte' (ExecuTorch's "
                "Python runtime, or where that lacks your delegate, a refusal carrying the runtime's "
                "RuntimeNotFound hint) or 'kernels' (your host kernels); set verify_method to one of them"
            )
        return self

    @field_validator("api_version")
    @classmethod
    def _check_api(cls, v: int) -> int:
        # which versions load is the registry's to say, in one line naming the plugin (edgeplug._api.refusal)
        if v < 0:
            raise ValueError(f"plugin API version {v} is not a version (they count from 0; this core speaks {API_VERSION})")
        return v


class KeepWhole(_Record):
    """Operators the backend keeps whole (``to_edge`` does not decompose them).

    The core keeps an op whole only on nodes the backend will delegate; the
    others are decomposed (and the report says why).
    """

    ops: tuple[Any, ...]

    @field_validator("ops")
    @classmethod
    def _check_ops(cls, ops: tuple[Any, ...]) -> tuple[Any, ...]:
        import torch  # torch: `import edgeplug` loads this module; only a record that names ops pays for it

        for op in ops:
            if not isinstance(op, torch._ops.OpOverload):
                raise ValueError(
                    f"{op!r} is not an operator overload (use e.g. "
                    "torch.ops.aten.linear.default, not torch.ops.aten.linear)"
                )
        return tuple(ops)


class PartitionerFilter(_Record):
    """Refines, per node, what the backend takes (see ``edgeplug_partitioner_filters``).

    ``fn(node, ctx)`` returns ``False`` (refuse: a kept-whole op is decomposed,
    a node is left on the CPU), ``True`` (accept, which overrides only the
    backend's constant-only rule, never its support check) or ``None`` (no
    opinion). ``ctx`` is an ``edgeplug.plugin.FilterContext``.
    """

    name: str
    fn: Callable[[Any, Any], Optional[bool]]


#: Where a fused op's weight comes from: a leaf constant (parameter, buffer,
#: lifted constant), a constant computed from leaves (Gemma's ``1 + w``), or a
#: runtime value. The core's fusion classifies nodes with the same names.
WeightSource = Literal["leaf", "computed", "runtime"]


#: What a fused op's argument is, in ``FusionPolicy.arguments``: the normalised
#: tensor, the ``[D]`` list of the normalised axis' size, the weight, the eps.
FusedArgument = Literal["input", "normalized_shape", "weight", "eps"]


class FusionPolicy(_Record):
    """What a matched pattern becomes on this backend: the op it emits, and when.

    ``emits`` reads the op back: ``aten.rms_norm(input, normalized_shape,
    weight, eps)`` or ``et_vk.rms_norm(input, weight, eps)``. The core emits
    whatever op a policy names (it never lists the ops it knows); the target
    is resolved when the plugin loads, after ``load_target`` ran.
    """

    pattern: Literal["rms_norm"] = "rms_norm"
    #: The fused operator as ``namespace.name`` (its default overload), e.g.
    #: "aten.rms_norm" or "et_vk.rms_norm".
    target: str
    #: The fused op's positional arguments, in order. A weight argument the
    #: op's schema makes optional gets None for "no weight"; a required one
    #: gets a constant of ones.
    arguments: tuple[FusedArgument, ...] = ("input", "normalized_shape", "weight", "eps")
    #: Makes ``target`` resolvable: imports the library that registers a custom
    #: op (e.g. executorch's Vulkan custom ops for ``et_vk``). None for aten ops.
    load_target: Optional[Callable[[], Any]] = None
    #: Weight sources the fused op may take directly.
    weight_sources: frozenset[WeightSource] = frozenset({"leaf"})
    #: A weight that is ``dequantize(constant)`` (a PT2E-quantized program):
    #: "keep" it so (the backend reads static quantized tensors), or "fold" it
    #: at AOT into a float constant (the backend prepacks a float weight).
    dequantized_weights: Literal["keep", "fold"] = "fold"
    #: Fold computed constant weights (Gemma's 1 + w) into a new constant.
    fold_computed_constants: bool = True
    #: For a weight the fused op cannot take (a runtime scale, a scalar, a
    #: weight not of shape [D]): fuse the norm with a unit weight, keep the multiply.
    unit_weight_fallback: bool = True
    #: A norm with no weight at all: "fuse" it (None, or ones where the op's
    #: weight is required); fuse it with "ones", a constant of ones of shape
    #: [D] in the norm's dtype, even where the schema takes None (also the unit
    #: weight of a norm fused alone), for a kernel and quantizer that read the
    #: weight as a tensor whatever the schema says; or "keep" it decomposed.
    weightless: Literal["fuse", "ones", "keep"] = "fuse"
    #: The fused kernel accumulates in fp32 whatever the storage dtype.
    fp32_accumulation: bool = False

    @field_validator("arguments")
    @classmethod
    def _check_arguments(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        missing = [a for a in ("input", "weight", "eps") if a not in v]
        if missing or len(set(v)) != len(v):
            raise ValueError(
                f"arguments {v} must name input, weight and eps once each (normalized_shape at most once), "
                "in the fused op's order"
            )
        return v

    @property
    def emits(self) -> str:
        """``et_vk.rms_norm(input, weight, eps)``: the op and its argument layout."""
        return f"{self.target}({', '.join(self.arguments)})"


def aten_rms_norm_policy(backend: str, **fields: Any) -> FusionPolicy:
    """The ``FusionPolicy`` of a backend whose partitioner delegates ``aten.rms_norm`` (qnn, samsung, coreml).

    The fused op is ``aten.rms_norm(input, [D], weight, eps)``. A leaf weight of shape [D] is taken as it
    is; a ``dequantize(constant)`` weight is kept so (the backend reads static quantized weights); Gemma's
    ``1 + w`` and static views are folded into a new constant at AOT; a runtime scale stays a multiply
    after a norm fused with a unit weight; the kernel is not assumed to accumulate in fp32. ``fields``
    change any field of the record (``weightless="ones"`` for a kernel that reads the weight as a tensor
    whatever the schema says). Keep ``torch.ops.aten.rms_norm.default`` whole too (a ``KeepWhole``
    record, or your partitioner's own ``ops_to_not_decompose``): without that, nothing fuses and each
    match is reported as rejected, saying so.
    """
    shared: dict[str, Any] = {
        "pattern": "rms_norm",
        "target": "aten.rms_norm",
        "arguments": ("input", "normalized_shape", "weight", "eps"),
        "weight_sources": frozenset({"leaf"}),
        "dequantized_weights": "keep",
        "fold_computed_constants": True,
        "unit_weight_fallback": True,
        "fp32_accumulation": False,
    }
    return FusionPolicy(backend=backend, **{**shared, **fields})


_OP_NAME = re.compile(r"^([A-Za-z_]\w*)\.(\w+)\.(\w+)$")


def resolve_op_name(name: str) -> str:
    """Check an op name of the form ``namespace.name.overload`` against torch's op registry.

    The name is the one edge programs and the host runtime use
    (``aten.linear.default``, ``et_vk.rms_norm.default``). Raises ``ValueError``
    saying what is wrong; an op of a namespace no library has registered yet
    (custom ops load with their backend) is accepted here and checked by the
    conformance suite once the backend's partitioner is imported.
    """
    m = _OP_NAME.match(name)
    if m is None:
        hint = name.replace("::", ".")
        if hint.count(".") == 1:
            hint += ".default"
        raise ValueError(
            f"op {name!r} is not written namespace.name.overload, the way edge programs name "
            f"ops (e.g. {hint!r}; 'aten::linear' or 'aten.linear' never match a node)"
        )

    import torch  # torch: `import edgeplug` loads this module; only a record that names ops pays for it

    ns, op, overload = m.groups()
    registered = _registered_ops(torch)
    if ns not in {n.split("::")[0] for n in registered}:
        return name  # a library not loaded yet; the conformance suite resolves it
    qualified = f"{ns}::{op}" + ("" if overload == "default" else f".{overload}")
    if qualified not in registered:
        close = difflib.get_close_matches(qualified, registered, n=1)
        suggestion = ""
        if close:
            full = close[0].replace("::", ".")
            suggestion = f"; did you mean {full if full.count('.') == 2 else full + '.default'!r}?"
        raise ValueError(f"op {name!r} is not a registered operator (torch.ops.{ns}.{op}.{overload}){suggestion}")
    return name


def _registered_ops(torch: Any) -> frozenset[str]:
    return frozenset(torch._C._dispatch_get_all_op_names())


class Kernel(_Record):
    """A runtime kernel for one op of one backend (host verification, benchmarks).

    ``op`` names the op the way edge programs do: ``namespace.name.overload``
    (``et_vk.rms_norm.default``); it is checked against torch's op registry
    when the plugin loads.
    """

    op: str
    impl: Callable[..., Any]
    device: Literal["wgpu", "cpu"] = "wgpu"
    #: Validates arguments before dispatch; raises with a clear message.
    checks: Optional[Callable[..., None]] = None

    @field_validator("op")
    @classmethod
    def _check_op(cls, v: str) -> str:
        return resolve_op_name(v.strip())


class PassSpec(_Record):
    """A backend pass. ``fn(ep) -> ExportedProgram | None`` (None: changed in place).

    Stages: ``"export"`` runs on the aten program before ``to_edge``;
    ``"edge"`` on the edge program, after the core's constant folding and
    before its fusion; ``"pre_partition"`` after the fusion, just before
    partitioning (the core's canonicalizing rewrites run there by default, so
    the fusion matches the graph as exported).

    Passes of one backend and stage run in an order that honours every
    ``before`` / ``after`` constraint (names of other passes of the backend,
    from any plugin); ``order`` only breaks ties (lower first), then the order
    plugins yielded them. Names are unique per backend.
    """

    stage: Literal["export", "edge", "pre_partition"]
    name: str
    fn: Callable[[Any], Any]
    #: Names of passes this one must run before / after.
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    #: Tie-break between passes no constraint orders (lower first).
    order: int = 0

    @field_validator("before", "after", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        return (v,) if isinstance(v, str) else v


_SCHEME = re.compile(r"^[a-z0-9][a-z0-9_\-]*$")


class QuantScheme(_Record):
    """A quantization scheme of a backend, for ``edgeplug.quantize`` and ``lower --quantize``.

    ``kind`` says what ``factory()`` returns: for ``"pt2e"`` (the default) a
    fresh, configured torchao ``Quantizer`` (executorch's ``QnnQuantizer``,
    ``XNNPACKQuantizer``, ...) that ``prepare_pt2e``/``convert_pt2e`` apply to
    the exported program; for ``"source_transform"`` a torchao config
    (``Int8DynamicActivationIntxWeightConfig``, ``IntxWeightOnlyConfig``, ...)
    that ``torchao.quantization.quantize_`` applies to the model's linear layers
    before export (on a deep copy: the caller's model is not changed), or a
    sequence of ``(config, filter_fn)`` pairs applied in order, ``filter_fn(module,
    fqn)`` choosing the modules as ``quantize_``'s own argument does (None: linear
    layers), e.g. embeddings. Building either must not reach the network. The
    other fields say what the scheme means.
    """

    #: the name users pass (``--quantize 8a8w``), lower-case
    scheme: str
    factory: Callable[[], Any]
    #: "pt2e": factory() is a PT2E Quantizer; "source_transform": a torchao config for quantize_
    kind: Literal["pt2e", "source_transform"] = "pt2e"
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

#: the key, in a fused op node's ``meta["custom"]`` (which export's retracing keeps), naming the
#: anchor of the fusion that made it: how a fused op decomposed again is traced to its record
FUSED_ANCHOR = "edgeplug_fused_anchor"


class FusionRecord(BaseModel):
    """One match of a pattern and what became of it."""

    model_config = ConfigDict(frozen=True)

    pattern: str
    anchor: str
    outcome: FusionOutcome
    reason: str = ""
    eps: Optional[float] = None
    weight: Optional[str] = None


TransformKind = Literal["fold", "rewrite"]


class TransformRecord(BaseModel):
    """One change a graph transform made to the program (the report's ``transforms``).

    ``fold``: a constant-only subgraph evaluated at AOT into one constant
    (``node`` is the node it replaced, ``removed`` the nodes that went with
    it, ``bytes_added`` the constant's size). ``rewrite``: an exact
    canonicalizing rewrite (``node`` replaced by ``added`` nodes).
    ``outcome="refused"``: the transform looked at ``node`` and left it as it
    was (``detail`` says why: over the fold budget, evaluation failed, ...);
    such a record changes nothing (``removed``, ``added``, ``bytes_added`` 0).
    """

    model_config = ConfigDict(frozen=True)

    transform: str
    kind: TransformKind
    node: str
    op: str
    outcome: Literal["applied", "refused"] = "applied"
    removed: int = 1
    added: int = 0
    bytes_added: int = 0
    detail: str = ""

    @model_validator(mode="after")
    def _refusal_changes_nothing(self) -> "TransformRecord":
        if self.outcome == "refused" and (self.removed or self.added or self.bytes_added):
            raise ValueError("a refused transform record changes nothing: give removed=0, added=0, bytes_added=0")
        return self


#: hook name -> the record type it yields
HOOK_RECORDS: dict[str, type[BaseModel]] = {
    "edgeplug_backends": BackendSpec,
    "edgeplug_keep_whole": KeepWhole,
    "edgeplug_partitioner_filters": PartitionerFilter,
    "edgeplug_fusion_policies": FusionPolicy,
    "edgeplug_kernels": Kernel,
    "edgeplug_passes": PassSpec,
    "edgeplug_quantizers": QuantScheme,
}
