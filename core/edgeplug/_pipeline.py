"""The lowering pipeline: a list of named stages, each timed by one clock.

``lower`` runs ``STAGES`` in order on a ``Lowering`` (the state they share):

- ``export``: the eager reference, on a copy of the model, its buffers and its
  inputs, then ``torch.export`` of another copy (a given ExportedProgram is
  copied and run for its reference in ``eager reference`` instead), so the
  caller's model and inputs are never changed;
- ``export passes``: the backend's export-stage passes;
- ``to_edge``: executorch's ``to_edge_transform_and_lower`` with the core's
  partitioner; the stages it runs inside (``edge passes + fusion``,
  ``partition + delegate``) enter the same clock, so each timing and each
  error names the stage that was really running;
- ``serialize .pte`` and ``verify``.

A stage that fails raises one ``EdgeplugError`` naming the stage, the backend
and the party at fault (``edgeplug._failures``).

Before any stage, ``prepare`` settles what the lowering is asked for (``Prepared``): the flags read and
checked once, the backend's partitioner built once (its factory called once per lowering; the fusion's
veto and the trial partition of ``copy_shared_constants`` use the same one). ``lower`` takes the
``Backend`` the façade resolved (``edgeplug._facade``); nothing here looks a backend up by name.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Optional

import torch
from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
from executorch.exir.lowered_backend_module import get_lowered_submodules
from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
from executorch.exir.pass_manager import ExportedProgramPassManager
from torch.export import ExportedProgram

from edgeplug import _executorch
from edgeplug._backend import Backend, given_backend
from edgeplug._eager import Reference, eager_model, run_eager
from edgeplug._errors import EdgeplugError, ExecutorchVersionError, LoweringError
from edgeplug._failures import edgeplug_cause, first_line, name_the_plugin, root_cause, stage_failure, train_mode_dropout
from edgeplug._fusion.program import fuse_for_backend, fusion_stage
from edgeplug._fusion.rms_norm import find_rms_norms
from edgeplug._fusion.target import resolve_target
from edgeplug._graph import PassResult, run_passes
from edgeplug._graph.cache_writes import values_at_indexed_shape
from edgeplug._graph.constants import constant_placeholders
from edgeplug._graph.fold import fold_constant_subgraphs
from edgeplug._graph.ir_check import edge_compile_config, ops_outside_core_aten, refuse_without_cpu_kernel
from edgeplug._graph.names import copy_exported_program, copy_graph
from edgeplug._graph.ops import op_name
from edgeplug._graph.passes import core_pass
from edgeplug._inputs import ExampleInputs, inputs_for, runtime_inputs
from edgeplug._records import FusionRecord, PassSpec, TransformRecord
from edgeplug._lowered import foreign_passes, partition_of, partitions
from edgeplug._memory import StageMemory
from edgeplug._partition import CorePartitioner
from edgeplug._partition.delegation import delegation
from edgeplug._partition.phases import copy_shared_constants
from edgeplug._quantize.quantize import drop_no_op_casts
from edgeplug._quantize.program import QuantizationInfo, QuantizedModel, describe_quantization, is_quantized
from edgeplug._report.records import (
    STAND_IN_KEY, CpuNode, GraphNode, LoweringReport, StageTiming, StandIn, annotate_graph, graph_of,
)
from edgeplug._plugin_code import plugin_location
from edgeplug._result import LoweringResult
from edgeplug._shape_env import kept_shape_envs
from edgeplug._graph.export_stage import export_stage_passes
from edgeplug._verify import refuse_verify_without_runtime, verify_lowering
from edgeplug._verify.options import VerifyOptions, verify_options
from edgeplug._weights import (
    check_external_weights, external_constants, lowered_modules_released, serialized_size, shared_weights_in_preprocess,
    spilled_weights, tag_external,
)

Progress = Callable[[str], None]


# -- the stages -------------------------------------------------------------------


class StageClock:
    """Times and names the stage now running: the one source of the report's stage timings."""

    def __init__(self, backend: str, say: Progress, memory: Any = None) -> None:
        self.backend, self.say = backend, say
        #: an ``edgeplug._memory.StageMemory`` when memory is profiled: each stage's peak resident MiB
        self.memory = memory
        self.timings: list[StageTiming] = []
        self.current: Optional[str] = None
        self._started = 0.0

    def enter(self, stage: str) -> None:
        self.stop()
        self.say(f"[{self.backend}] {stage} ...")
        if self.memory is not None:
            self.memory.start()
        self.current, self._started = stage, time.perf_counter()

    def stop(self) -> None:
        if self.current is not None:
            seconds = time.perf_counter() - self._started
            peak = round(self.memory.stop(), 1) if self.memory is not None else None
            self.timings.append(StageTiming(stage=self.current, seconds=seconds, peak_rss_mib=peak))
            self.current = None


@dataclass(frozen=True)
class Prepared:
    """What one lowering settled before any work (``prepare``); used by one lowering only."""

    backend: Backend
    #: the one partitioner of the lowering, around the one executorch partitioner the backend's factory made
    partitioner: CorePartitioner
    dry_run: bool = False
    #: what verification runs (None: none; a dry run verifies nothing)
    verification: Optional[VerifyOptions] = None
    external_weights: bool = False
    #: what the report says of the flags (verification skipped by a dry run)
    notes: tuple[str, ...] = ()
    #: ExecuTorch's ETRecord: None (none), True (kept in the result), or a path it is also written to
    etrecord: Any = None


@dataclass
class Lowering:
    """The state ``STAGES`` share."""

    source: torch.nn.Module | ExportedProgram
    inputs: ExampleInputs
    backend: Backend
    clock: StageClock
    partitioner: CorePartitioner
    dry_run: bool = False
    #: what ``verify`` runs, decided once by ``prepare``; None: the stage does not run
    verification: Optional[VerifyOptions] = None
    notes: tuple[str, ...] = ()
    label: str = ""
    #: what ``quantize`` did, where the source is its ``QuantizedModel`` (the report's and verification's)
    quantization: Optional[QuantizationInfo] = None
    #: the weights go into a .ptd beside the .pte (``edgeplug._weights``)
    external_weights: bool = False
    #: keep a dry run's serialized program (stand-in delegates), for ``save(path, stand_in=True)``
    keep_stand_in: bool = False
    #: ``Prepared.etrecord``
    etrecord: Any = None
    #: ``torch.export``'s dynamic_shapes for a module source
    dynamic_shapes: Any = None
    ep: Optional[ExportedProgram] = None
    reference: Optional[Reference] = None
    fusions: list[FusionRecord] = field(default_factory=list)
    #: op name -> who created it (a core transform, a plugin's pass): named when a check refuses one
    created_ops: dict[str, str] = field(default_factory=dict)
    transforms: list[TransformRecord] = field(default_factory=list)
    #: the edge graph as the partitioner received it (the report's ``graph``, annotated in ``_report_of``)
    graph: list[GraphNode] = field(default_factory=list)
    edge: Any = None
    report: Optional[LoweringReport] = None
    result: Optional[LoweringResult] = None


def _without_grad(module: torch.nn.Module) -> torch.nn.Module:
    # lowering never trains: a parameter that carries requires_grad cannot be
    # updated in place (KV caches) nor serialized; the copy drops it
    for p in module.parameters():
        p.requires_grad_(False)
    return module


def _copy_model(model: torch.nn.Module) -> torch.nn.Module:
    # parameters are shared, not copied (the program only reads them; a new Parameter on the same
    # storage, so that dropping requires_grad leaves the caller's as they were): a model's weights
    # are most of its memory. Buffers are copied detached (the program may write them); one written
    # under grad mode (a KV cache) is not a leaf, and copy.deepcopy refuses such tensors
    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo.setdefault(id(p), torch.nn.Parameter(p.detach(), requires_grad=False))
    for b in model.buffers():
        memo.setdefault(id(b), b.detach().clone())
    try:
        return _without_grad(copy.deepcopy(model, memo))
    except Exception as exc:
        raise LoweringError(
            f"cannot copy the model ({type(exc).__name__}: {exc}); edgeplug lowers a copy so that your "
            "model is left as it was. Make the model deep-copyable (copy.deepcopy)"
        ) from exc


def _export(job: Lowering) -> None:
    job.reference = run_eager(eager_model(job.source), job.inputs)
    model = _copy_model(job.source)
    args, kwargs = copy.deepcopy((job.inputs.args, job.inputs.kwargs))
    # torch.export prints the partial graph of a failed export to stderr; the error carries it
    # (``partial_fx_graph``, shown with --debug), so the user's terminal ends in one error line
    printed = io.StringIO()
    with torch.no_grad(), contextlib.redirect_stderr(printed):
        job.ep = torch.export.export(model, args, kwargs, dynamic_shapes=job.dynamic_shapes)
    sys.stderr.write(printed.getvalue())  # what a successful export printed still reaches the user
    _refuse_random_verification(job)
    _in_program_order(job)


def _refuse_random_verification(job: Lowering) -> None:
    """A program that drops out at random (a model in training mode) computes other numbers each call:
    verification would compare two draws, so it is refused with the fix, before any more work."""
    if job.verification is None:
        return
    found = train_mode_dropout(job.ep)
    if found is not None:
        raise EdgeplugError(
            f"in the model: the model is in training mode and drops out at random: {found}. Its outputs "
            "differ on every call, so --verify cannot compare the lowered program with eager (and the .pte "
            "would drop out too). Fix: call model.eval() before lowering (dropout then passes its input "
            "through); nothing was written"
        )


def _in_program_order(job: Lowering) -> None:
    """The reference's inputs after the call, flattened as the program orders its inputs (keywords by its in-spec)."""
    ref = job.reference
    if ref is not None and ref.inputs_tree is not None:
        ref.inputs_after = runtime_inputs(job.ep, ref.inputs_tree)


def _program_reference(job: Lowering) -> None:
    job.ep = copy_exported_program(job.source)
    for t in job.ep.state_dict.values():
        t.requires_grad_(False)
    _refuse_random_verification(job)
    job.reference = run_eager(eager_model(job.source), job.inputs)
    _in_program_order(job)


def _fusion_pass(job: Lowering, stage: Literal["export", "edge"]) -> PassSpec:
    """The core's fusion as a pass of ``stage``: its records go to the report, and the ops it
    creates are remembered so that a later check refusing one names the fusion, not executorch."""
    def fusion(ep: ExportedProgram) -> ExportedProgram:
        if job.backend.fusion_policy("rms_norm") is not None and not find_rms_norms(ep):
            # no norm, so nothing to fuse and no record: the program stays as it is (the fusion would
            # copy and revalidate it first)
            job.fusions = []
            return ep
        # the veto asks the lowering's own partitioner's support check: the factory is not called again
        out, job.fusions = fuse_for_backend(ep, job.backend, delegation(job.backend, lambda: job.partitioner.support))
        if any(r.outcome != "rejected" for r in job.fusions):
            policy = job.backend.fusion_policy("rms_norm")
            job.created_ops.setdefault(
                op_name(resolve_target(policy, ep.dialect).op),
                f"the edgeplug core's {stage}-stage rms_norm fusion, under the fusion policy of backend "
                f"{job.backend.name!r} from {_policy_origin(job.backend, policy)}",
            )
        return out

    return core_pass("fuse", fusion, stage=stage)


def _policy_origin(backend: Backend, policy: Any) -> str:
    origin = backend.origin(policy) if hasattr(backend, "origin") else None
    return origin.describe() if origin is not None else backend.distribution


def _drop_no_op_casts(ep: ExportedProgram) -> PassResult:
    out, records = drop_no_op_casts(ep)
    return PassResult(out, tuple(records))


def _export_passes(job: Lowering) -> None:
    passes = export_stage_passes(job.ep, job.backend)
    policy = job.backend.fusion_policy("rms_norm")
    if fusion_stage(policy) == "export":
        # export's metadata check after ``weight * x.to(dtype)`` is a second user of the normalised
        # tensor and hides the weight multiply from the matcher, which then sees a norm without a
        # weight: a policy whose op reads a weight tensor (samsung's ones for a weightless norm, or a
        # policy keeping such norms decomposed) would fuse a weighted norm alone, or reject it.
        # Dropped first for those policies only; qnn and coreml fuse the norms without it
        if policy is not None and policy.weightless != "fuse":
            passes.append(core_pass("drop_no_op_casts", _drop_no_op_casts, stage="export"))
        passes.append(_fusion_pass(job, "export"))  # before to_edge: see fusion_stage
    done = run_passes(job.ep, passes, backend=job.backend, created=job.created_ops)
    job.ep, job.transforms = done.program, list(done.records)


def _edge_stage(job: Lowering) -> Any:
    """The pass executorch runs between to_edge and partitioning: constant folding, the backend's
    edge passes, fusion, then the backend's pre-partition passes (the core's rewrites it chose)."""

    def constant_fold(ep: ExportedProgram) -> PassResult:
        return PassResult(ep, tuple(fold_constant_subgraphs(ep, budget=job.backend.spec.constant_fold_budget)))

    fuses_here = fusion_stage(job.backend.fusion_policy("rms_norm")) == "edge"

    def copy_shared(ep: ExportedProgram) -> PassResult:
        # BackendSpec.copy_shared_constants: where the partitions will fall is known only by partitioning;
        # a trial partition of this program (executorch forbids a partitioner to change the graph) says
        # which constants several partitions read, then each gets its own copy and the real partitioning
        # tags every copy with its one partition. No constant read twice, nothing to copy: no trial partition
        constants = constant_placeholders(ep)
        if not any(n.op == "placeholder" and n.name in constants and len(n.users) > 1 for n in ep.graph.nodes):
            return PassResult(ep, ())
        tags = _trial_partition(job, ep)
        _, copied = copy_shared_constants(ep, tags)
        return PassResult(ep, tuple(
            TransformRecord(
                transform="copy_shared_constants", kind="rewrite", node=name, op="placeholder", removed=1, added=len(users),
                detail=f"each partition reading it ({', '.join(users)}) holds its own copy, so no delegate is handed "
                "a weight as a runtime input (as stock ExecuTorch copies it; BackendSpec.copy_shared_constants=False "
                "keeps it one input for a runtime that takes shared weights)",
            )
            for name, users in copied.items()
        ))

    class EdgeplugEdgeStage(ExportedProgramPassBase):
        def call(self, exported_program: ExportedProgram) -> ExportedProgramPassResult:
            job.clock.enter("edge passes + fusion")
            # the core's folding and fusion go through the runner too: names reserved, graphs linted
            passes = [
                core_pass("constant fold", constant_fold),
                *job.backend.passes_for("edge"),
                *([_fusion_pass(job, "edge")] if fuses_here else []),
                *job.backend.passes_for("pre_partition"),
                *([core_pass("copy shared constants", copy_shared)] if job.backend.spec.copy_shared_constants else []),
            ]
            done = run_passes(exported_program, passes, backend=job.backend, created=job.created_ops)
            ep = done.program
            job.transforms = [*job.transforms, *done.records]  # after the export stage's
            job.graph = graph_of(ep)
            job.clock.enter("partition + delegate")
            return ExportedProgramPassResult(ep, True)

    return EdgeplugEdgeStage()


def _trial_partition(job: Lowering, ep: ExportedProgram) -> dict[Any, str]:
    """The delegation tag each node of ``ep`` would get (``copy_shared_constants``' trial partition, a dry run of the
    backend's partitioner), the tags taken off again; ops it would strand, or a partitioner that raises, fail as the
    real partitioning would."""
    trial = CorePartitioner(job.backend, dry_run=True, inner=job.partitioner.inner)
    try:
        trial.partition(ep)
    except EdgeplugError as exc:
        if trial.stranded:  # the real partitioning would strand the same ops: said as it would say it
            raise _stranded_error(trial, job.created_ops) from exc
        raise
    except Exception as exc:  # the backend's partitioner raised: its fault, not this core pass's
        err = stage_failure(exc, "partition + delegate", job.backend, job.created_ops)
        err.args = (
            f"{err.args[0]} (raised while edgeplug ran the backend's partitioner on the edge program to find "
            "the constants several partitions read, BackendSpec.copy_shared_constants; the real partitioning "
            "would raise the same)",
        )
        raise err from exc
    return {n: n.meta.pop("delegation_tag") for n in ep.graph_module.graph.nodes if "delegation_tag" in n.meta}


def _stranded_error(partitioner: CorePartitioner, created: dict[str, str]) -> LoweringError:
    """The error for ops kept whole (or fused) for the backend and then left on the CPU: each op, why it was not
    taken, and the transform that created it where one did (that transform is at fault)."""
    made = {s.op: created[s.op] for s in partitioner.stranded if s.op in created}
    who = "".join(f" {op} was created by {creator}: that transform is at fault." for op, creator in made.items())
    err = LoweringError(partitioner.stranded_message() + who)
    # the message names who is at fault (a pass, a fusion, or the backend's checks): no pass runner rewraps it
    err.at_fault = "; ".join(sorted(set(made.values()))) or f"backend {partitioner.backend.name!r}'s checks"
    return err


def make_partitioner(backend: Backend, dry_run: bool = False) -> CorePartitioner:
    """The backend's partitioner for one lowering; a factory that raises is a LoweringError naming the plugin
    (``prepare`` calls this before any work, so such a backend fails in a second, not after export)."""
    try:
        return CorePartitioner(backend, dry_run=dry_run)
    except EdgeplugError:
        raise
    except Exception as exc:
        b = backend
        gap = _executorch.version_gap(exc)
        if gap is not None:  # the installed executorch lacks what the plugin imports: neither's bug
            raise ExecutorchVersionError(
                f"backend {b.name!r} ({b.plugin.describe()}) cannot make its partitioner: {gap}; nothing was done"
            ) from exc
        raise LoweringError(
            f"the partitioner factory (BackendSpec.partitioner) of backend {b.name!r}, from "
            f"{b.plugin.describe()}, raised {first_line(root_cause(exc))}{plugin_location(exc, b.plugin)}. Check the backend's "
            "configuration (its environment variables), or report it to the plugin's maintainers"
        ) from exc


def _to_edge(job: Lowering) -> None:
    b = job.backend
    if job.external_weights:
        tag_external(job.ep)
    # the backend's own scope for partitioning and preprocess (BackendSpec.lowering_context)
    scope = b.spec.lowering_context() if b.spec.lowering_context is not None else contextlib.nullcontext()
    # edgeplug's strict IR check (edgeplug._graph.ir_check): the model's own ops outside core ATen go through
    # it, as stock's flow lets them through; what a transform created does not
    allowed = ops_outside_core_aten(job.ep, job.created_ops)
    try:
        with scope, shared_weights_in_preprocess(), spilled_weights(job.external_weights):
            job.edge = to_edge_transform_and_lower(
                job.ep,
                transform_passes=ExportedProgramPassManager([_edge_stage(job)]),
                partitioner=[job.partitioner],
                # the edge IR check runs in a dry run too: it lowers to a stand-in backend
                compile_config=edge_compile_config(allowed),
                # ExecuTorch's ETRecord of this lowering, where asked: the aten and edge programs, then the
                # executorch program to_executorch adds (Inspector and calculate_numeric_gap read it)
                generate_etrecord=job.etrecord is not None,
            )
    except Exception as exc:
        if job.partitioner.stranded:  # executorch's "was not decomposed or delegated", said fully
            raise _stranded_error(job.partitioner, job.created_ops) from exc
        raise
    # one of those left on the CPU where no ExecuTorch kernel runs it: refused now, not at load on the device
    refuse_without_cpu_kernel(job.edge.exported_program(), allowed, b.name, job.partitioner.cpu_reasons)
    job.report = _report_of(job)


class _GraphCopy(ExportedProgramPassBase):
    """A copy of the program's graph and signature; its tensors and delegates are the program's own."""

    def call(self, exported_program: ExportedProgram) -> ExportedProgramPassResult:
        return ExportedProgramPassResult(copy_graph(exported_program), True)


def _serialize(job: Lowering) -> None:
    ep = job.edge.exported_program()
    # executorch's in-place index_put_ takes values of the indexed shape only (cache[:, :, pos] = k drops k's
    # leading 1s): they get them back, or, where a write's values broadcast, every write stays functional
    in_place, records = values_at_indexed_shape(ep)
    job.report.transforms.extend(records)
    if any(n.op == "call_function" and "quantized_decomposed" in str(n.target) for n in ep.graph.nodes):
        # a quantize/dequantize left on the CPU needs its out variant, which this import registers: the
        # kernel library loads (seconds) only for a program that has one
        import executorch.kernels.quantized  # noqa: F401
    with spilled_weights(job.external_weights):
        # to_executorch rewrites the programs it is given in place: it gets a copy of their graphs (tensors and
        # delegates shared), so that the result's edge stays the edge-dialect program the report describes
        serializing = job.edge.transform(ExportedProgramPassManager([_GraphCopy()]))
        program = serializing.to_executorch(_executorch_config(ep, job.external_weights, in_place=in_place))
    if job.etrecord is not None:
        job.result.etrecord = record = program.get_etrecord()
        if not job.inputs.kwargs:  # the example call, which calculate_numeric_gap runs the aten program on
            record.update_representative_inputs([tuple(job.inputs.args)])
    if not job.dry_run:  # a dry run serializes too (every check of the real flow), then keeps nothing
        job.result.program, job.result.pte_bytes = program, serialized_size(program)
    elif job.keep_stand_in:  # unless asked: save(path, stand_in=True) writes it as STEM.stand-in.pte
        job.result.program, job.result.pte_bytes = program, serialized_size(program)


def _verify(job: Lowering) -> None:
    options = job.verification
    assert options is not None  # the stage runs only then
    job.report.verification = verify_lowering(job.result, job.backend, tolerance=options.tolerance, verify_steps=options.steps)


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Lowering], None]
    #: whether the stage runs for this lowering
    applies: Callable[[Lowering], bool] = lambda job: True


STAGES: tuple[Stage, ...] = (
    Stage("export", _export, lambda job: not isinstance(job.source, ExportedProgram)),
    Stage("eager reference", _program_reference, lambda job: isinstance(job.source, ExportedProgram)),
    Stage("export passes", _export_passes),
    Stage("to_edge", _to_edge),
    Stage("serialize .pte", _serialize),
    Stage("verify", _verify, lambda job: job.verification is not None),
)


def _run_stage(job: Lowering, stage: Stage) -> None:
    job.clock.enter(stage.name)
    try:
        stage.run(job)
    except EdgeplugError as exc:
        exc.lowering_stage = getattr(exc, "lowering_stage", None) or job.clock.current
        name_the_plugin(exc, job.backend)  # the same error, its plugin named
        raise
    except Exception as exc:
        ours = edgeplug_cause(exc)
        if ours is not None:  # e.g. a PassError executorch's pass manager wrapped
            ours.lowering_stage = getattr(ours, "lowering_stage", None) or job.clock.current
            raise name_the_plugin(ours, job.backend) from exc
        raise stage_failure(exc, job.clock.current or stage.name, job.backend, job.created_ops) from exc
    job.clock.stop()


# -- the report ----------------------------------------------------------------------


def _support_note(b: Backend, partitioner: Any) -> list[str]:
    """The backend's sentence on what decided its support in this lowering (``BackendSpec.support_note``)."""
    if b.spec.support_note is None:
        return []
    try:
        note = b.spec.support_note(partitioner)
    except Exception as exc:
        raise LoweringError(
            f"the support note of backend {b.name!r} (BackendSpec.support_note, from {b.plugin.describe()}) raised "
            f"{type(exc).__name__}: {exc}; the plugin's author can fix it"
        ) from exc
    return [note] if isinstance(note, str) and note else []


def _report_of(job: Lowering) -> LoweringReport:
    b, p = job.backend, job.partitioner
    parts, delegated, cpu = partitions(job.partitioner, job.edge.exported_program(), b.name)
    fusions = _undone(job.fusions, p.undone_fusions)
    report = LoweringReport(
        model=job.label,
        backend=b.name,
        distribution=f"{b.distribution} {b.version}".strip(),
        dry_run=job.dry_run,
        partitions=parts,
        delegated_ops=dict(delegated),
        cpu_ops=dict(Counter(c.op for c in cpu)),
        cpu_nodes=cpu,
        fusions=fusions,
        transforms=job.transforms,
        graph=annotate_graph(
            job.graph, partition_of(job.edge.exported_program(), job.partitioner),
            {c.node: c.reason for c in cpu}, fusions, job.transforms,
        ),
        kept_whole_on_cpu=[CpuNode(node=k.node, op=k.op, reason=k.reason) for k in p.stranded],
        decomposed_instead=[CpuNode(node=n, op=op, reason=why) for n, (op, why) in p.decomposed.items()],
        notes=foreign_passes(b) + _support_note(b, p.inner),
    )
    report.stand_in = _stand_in_record(job)
    if report.stand_in is not None:
        report.dry_run = True  # no delegate holds a compiled program, whoever stood in for the compiler
        held = report.stand_in
        if held.kind == "backend":
            report.notes.append(held.reason)
        if held.recording:
            report.notes.append(
                f"the stand-in preprocess recorded its work in {held.recording}"
                + (" (kept)" if held.recording_kept else f", removed when the process ends{held.keep_hint and f' ({held.keep_hint})'}")
            )
    if p.stranded:
        report.notes.append(p.stranded_message())
    if not parts and cpu:
        report.notes.append(
            f"nothing was delegated to backend {b.name!r}: all {len(cpu)} nodes run on the CPU "
            "(each node's reason is listed with it)"
        )
    job.result = LoweringResult(
        report=report, exported_program=job.ep, edge=job.edge, args=job.inputs.args, kwargs=job.inputs.kwargs,
        reference=job.reference, quantization=job.quantization,
    )
    return report


def _stand_in_record(job: Lowering) -> Optional[StandIn]:
    """What the lowered program's delegates hold when it is not a compiled program: edgeplug's dry run, or
    a backend's stand-in preprocess (``STAND_IN_KEY`` in what its preprocess returned as delegate info)."""
    lowered = [m for _name, m, _node in get_lowered_submodules(job.edge.exported_program().graph_module)]
    if job.dry_run:
        return StandIn(
            kind="dry run", delegates=len(lowered),
            reason=f"dry run: {'the delegate holds' if len(lowered) == 1 else f'the {len(lowered)} delegates hold'} "
            "an empty stand-in payload (edgeplug compiled nothing), so this program does not run",
        )
    said = [_executorch.delegate_info(m) for m in lowered]
    said = [s[STAND_IN_KEY] for s in said if isinstance(s, dict) and isinstance(s.get(STAND_IN_KEY), dict)]
    if not said:
        return None
    folders = [s.get("folder") for s in said if s.get("folder")]
    return StandIn(
        kind="backend", delegates=len(said), reason=str(said[0].get("reason") or "stand-in delegate payloads"),
        recording=str(folders[-1]) if folders else None, recording_kept=bool(said[-1].get("kept")),
        keep_hint=str(said[-1].get("keep_hint") or ""),
    )


def _undone(fusions: list[FusionRecord], undone: Mapping[str, str]) -> list[FusionRecord]:
    """The fusion records as the lowered program has them: a fused op the partitioner would not keep
    whole was decomposed again by to_edge, so its record is a rejection saying why."""
    return [
        r.model_copy(update={"outcome": "rejected", "reason": (
            f"fused, then decomposed again by to_edge: the backend's partitioner would not keep it whole ({undone[r.anchor]})"
        )}) if r.anchor in undone and r.outcome != "rejected" else r
        for r in fusions
    ]


def run_lowering(
    model_or_ep: torch.nn.Module | ExportedProgram,
    args: Any = (),
    backend: Optional[Backend] = None,
    *,
    kwargs: Optional[dict[str, Any]] = None,
    dynamic_shapes: Any = None,
    verify: bool = False,
    dry_run: bool = False,
    model_name: Optional[str] = None,
    progress: Optional[Progress] = None,
    tolerance: Optional[float] = None,
    verify_steps: Optional[int] = None,
    external_weights: bool = False,
    profile_memory: bool = False,
    keep_stand_in: bool = False,
    etrecord: Any = None,
) -> LoweringResult:
    """What ``edgeplug.lower`` runs for the ``Backend`` the façade resolved (``edgeplug._facade.lower`` is
    the manual of every argument): the inputs checked, ``prepare``, then the stages."""
    b = given_backend(backend, "edgeplug._pipeline.run_lowering")
    source, given = _lowering_inputs(model_or_ep, args, kwargs, dynamic_shapes)
    prepared = prepare(
        b, verify=verify, verify_steps=verify_steps, tolerance=tolerance, dry_run=dry_run, external_weights=external_weights,
        etrecord=etrecord,
    )
    return _lower(prepared, source, given, dynamic_shapes, model_name, progress, profile_memory, keep_stand_in)


def lower_prepared(
    prepared: Prepared,
    model_or_ep: torch.nn.Module | ExportedProgram,
    args: Any = (),
    *,
    kwargs: Optional[dict[str, Any]] = None,
    dynamic_shapes: Any = None,
    model_name: Optional[str] = None,
    progress: Optional[Progress] = None,
    profile_memory: bool = False,
    keep_stand_in: bool = False,
) -> LoweringResult:
    """``run_lowering`` with what ``prepare`` settled earlier (the CLI prepares before it runs the model file)."""
    source, given = _lowering_inputs(model_or_ep, args, kwargs, dynamic_shapes)
    return _lower(prepared, source, given, dynamic_shapes, model_name, progress, profile_memory, keep_stand_in)


def prepare(
    backend: Backend, *, verify: bool = False, verify_steps: Optional[int] = None, tolerance: Optional[float] = None,
    dry_run: bool = False, external_weights: bool = False, etrecord: Any = None,
) -> Prepared:
    """The lowering's flags read and checked once, and what cannot work with this backend refused, before any work:
    verification without a runtime, a backend that cannot serialize here, external weights it does not store,
    a partitioner factory that raises (the partitioner is built here, once for the lowering)."""
    b = given_backend(backend, "edgeplug._pipeline.prepare")
    options = verify_options(verify, verify_steps, tolerance)
    notes: tuple[str, ...] = ()
    if options is not None and dry_run:
        options, notes = None, ("verification skipped: a dry run produces no program to run",)
    if options is not None:
        refuse_verify_without_runtime(b)
    b.require_available(dry_run=dry_run)
    if external_weights:
        check_external_weights(b)
    etrecord = _etrecord_request(etrecord, dry_run)
    return Prepared(
        backend=b, partitioner=make_partitioner(b, dry_run=dry_run), dry_run=dry_run, verification=options,
        external_weights=external_weights, notes=notes, etrecord=etrecord,
    )


def _etrecord_request(etrecord: Any, dry_run: bool) -> Any:
    """``lower``'s ``etrecord``: None or False (none), True (kept in the result), or a path (also written there)."""
    if etrecord is None or etrecord is False:
        return None
    if dry_run:
        raise EdgeplugError(
            "etrecord: a dry run compiles no delegate, so there is no program an ETRecord could describe; "
            "lower without dry_run (--dry-run) to get one; nothing was done"
        )
    if etrecord is True:
        return True
    if not isinstance(etrecord, (str, os.PathLike)):
        raise EdgeplugError(f"etrecord is True or a path to write ExecuTorch's ETRecord to, not {etrecord!r}; nothing was done")
    return os.fspath(etrecord)


def _lower(
    prepared: Prepared, source: Any, given: ExampleInputs, dynamic_shapes: Any, model_name: Optional[str],
    progress: Optional[Progress], profile_memory: bool, keep_stand_in: bool,
) -> LoweringResult:
    """The stages, on a ``Lowering`` made from what ``prepare`` settled."""
    quantization = source.quantization if isinstance(source, QuantizedModel) else None
    if isinstance(source, QuantizedModel):  # what quantize did rides in its result; its program is lowered
        source = source.program
    b = prepared.backend
    job = Lowering(
        source=source,
        inputs=given,
        dynamic_shapes=dynamic_shapes,
        backend=b,
        clock=StageClock(b.name, progress or (lambda msg: None), StageMemory() if profile_memory else None),
        partitioner=prepared.partitioner,
        external_weights=prepared.external_weights,
        keep_stand_in=keep_stand_in,
        dry_run=prepared.dry_run,
        verification=prepared.verification,
        notes=prepared.notes,
        etrecord=prepared.etrecord,
        label=model_name or type(source).__name__,
        quantization=quantization,
    )
    _run_stages(job)
    return job.result


def _run_stages(job: Lowering) -> None:
    """Every stage that applies, in order, then the report's timings and quantization."""
    # no grad: lowering never needs it, and grad mode must not change the program; the caller's
    # program keeps its ShapeEnv as it was (a second lowering of it must still trace)
    with torch.no_grad(), kept_shape_envs(job.source), lowered_modules_released():
        for stage in STAGES:
            if stage.applies(job):
                _run_stage(job, stage)
    job.report.notes.extend(job.notes)
    job.report.stages = job.clock.timings
    if isinstance(job.etrecord, str) and job.result.etrecord is not None:
        # written whether verification held or not: a divergence is what ExecuTorch's Inspector is for
        job.result.etrecord.save(job.etrecord)
    describe_quantization(job.report, job.quantization, is_quantized(job.source), job.backend)  # scheme, norms, quantize timings


# -- inputs ----------------------------------------------------------------------------


def _lowering_inputs(source: Any, args: Any, kwargs: Any, dynamic_shapes: Any) -> tuple[Any, ExampleInputs]:
    """``lower``'s model and inputs checked before any work: what was wrong, and what to pass instead."""
    program = source.program if isinstance(source, QuantizedModel) else source
    if not isinstance(program, (torch.nn.Module, ExportedProgram)):
        raise EdgeplugError(
            f"edgeplug.lower takes a torch.nn.Module or a torch.export.ExportedProgram, not {type(program).__name__}"
        )
    return source, inputs_for(program, args, kwargs, dynamic_shapes, where="edgeplug.lower")


def _executorch_config(ep: ExportedProgram, external_weights: bool = False, in_place: bool = True) -> Any:
    """``to_executorch``'s config: executorch's quantized-op fusion where torchao's dequantize is left on the
    CPU (a weight-only embedding: dequantize + embedding become ``quantized_decomposed.embedding_4bit``,
    which executorch's quantized kernels run; torchao's dequantize has no kernel); with external weights,
    the parameters left on the CPU go to the delegates' data file (``edgeplug._weights``); else the default.
    ``in_place``: whether executorch's in-place index_put_ takes every cache write (``values_at_indexed_shape``)."""
    fuse = any(n.op == "call_function" and "torchao.dequantize_affine" in str(n.target) for n in ep.graph.nodes)
    # a cache write left on the CPU (index_put on a mutable buffer) is made in place by executorch's reinplace
    # pass: the functional op copied the whole cache to a new tensor and the write-back copied it again, per step
    reinplace = in_place and any(
        n.op == "call_function" and "aten.index_put.default" in str(n.target) for n in ep.graph.nodes
    )
    if not fuse and not external_weights and not reinplace:
        return None
    return ExecutorchBackendConfig(
        do_quant_fusion_and_const_prop=fuse, external_constants=external_constants if external_weights else False,
        run_reinplace_pass=reinplace,
    )

