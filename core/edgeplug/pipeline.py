"""The lowering pipeline: export, passes, fusion, partitioning, .pte, report."""

from __future__ import annotations

import contextlib
import operator
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from torch.export import ExportedProgram

from edgeplug.backend import Backend, get_backend
from edgeplug.errors import EdgeplugError, LoweringError, VerificationError
from edgeplug.records import FusionRecord
from edgeplug.report import CpuNode, LoweringReport, OutputCheck, PartitionSummary, StageTiming, Verification

Progress = Callable[[str], None]


def _resolve(backend: str | Backend) -> Backend:
    return backend if isinstance(backend, Backend) else get_backend(backend)


def transform(ep: ExportedProgram, backend: str | Backend) -> ExportedProgram:
    """Run ``backend``'s export-stage passes on an aten-dialect program."""
    from edgeplug.graph import run_passes

    b = _resolve(backend)
    return run_passes(ep, b.passes_for("export"), backend=b)


def fuse(ep: ExportedProgram, backend: str | Backend) -> tuple[ExportedProgram, list[FusionRecord]]:
    """Apply the core's pattern fusions to an edge-dialect program under ``backend``'s policy.

    Returns a new program (``ep`` is not changed) and one ``FusionRecord`` per
    match: fused, folded, fused with a unit weight, or rejected with its reason.
    """
    from edgeplug.fusion import fuse_program

    return fuse_program(ep, _resolve(backend))


class _EdgeStage:
    """Edge-stage passes and fusion, run inside to_edge_transform_and_lower."""

    def __init__(self, backend: Backend, clock: dict[str, float], say: Progress) -> None:
        self.say = say
        self.backend = backend
        self.clock = clock
        self.fusions: list[FusionRecord] = []

    def make(self):
        from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult

        stage = self

        class EdgeplugEdgeStage(ExportedProgramPassBase):
            def call(self, exported_program: ExportedProgram) -> ExportedProgramPassResult:
                from edgeplug.graph import run_passes
                from edgeplug.graph.passes import core_pass

                def fusion(ep: ExportedProgram) -> ExportedProgram:
                    out, stage.fusions = fuse(ep, stage.backend)
                    return out

                stage.clock["edge_start"] = time.perf_counter()
                stage.say(f"[{stage.backend.name}] edge passes + fusion ...")
                # the core's fusion goes through the runner too: names reserved, graphs linted
                passes = [*stage.backend.passes_for("edge"), core_pass("fuse", fusion)]
                ep = run_passes(exported_program, passes, backend=stage.backend)
                stage.clock["edge_end"] = time.perf_counter()
                stage.say(f"[{stage.backend.name}] partition + delegate ...")
                return ExportedProgramPassResult(ep, True)

        return EdgeplugEdgeStage()


@dataclass
class LoweringResult:
    report: LoweringReport
    exported_program: ExportedProgram
    edge: Any  # executorch EdgeProgramManager
    program: Any = None  # executorch ExecutorchProgramManager (None on dry run)
    example_inputs: tuple = ()
    eager_outputs: list = field(default_factory=list)

    @property
    def buffer(self) -> bytes:
        if self.program is None:
            raise EdgeplugError("this was a dry run: there is no .pte to write")
        return self.program.buffer

    def save(self, path: str | os.PathLike) -> Path:
        """Write the .pte atomically: the file appears whole or not at all."""
        data = self.buffer
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        self.report.output_path = str(path)
        self.report.output_bytes = len(data)
        return path


def _flatten(out: Any) -> list[torch.Tensor]:
    import torch.utils._pytree as pytree

    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _count_delegated(edge_ep: ExportedProgram) -> tuple[list[PartitionSummary], Counter]:
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    parts: list[PartitionSummary] = []
    total: Counter = Counter()
    from edgeplug.partition import op_name

    for name, lowered, _node in get_lowered_submodules(edge_ep.graph_module):
        ops: Counter = Counter()
        for n in lowered.original_module.graph_module.graph.nodes:
            if n.op == "call_function" and n.target is not operator.getitem:
                ops[op_name(n.target)] += 1
        total.update(ops)
        parts.append(PartitionSummary(tag=name, backend_id=lowered.backend_id, nodes=sum(ops.values()), ops=dict(ops)))
    return parts, total


def _cpu_nodes(gm: torch.fx.GraphModule, reasons: dict[str, str], default: str, tagged: set[str] = frozenset()) -> list[CpuNode]:
    from edgeplug.partition import op_name

    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        if "executorch_call_delegate" in str(n.target) or n.name in tagged:
            continue
        out.append(CpuNode(node=n.name, op=op_name(n.target), reason=reasons.get(n.name, default)))
    return out


def _edgeplug_cause(exc: BaseException) -> Optional[EdgeplugError]:
    """The first EdgeplugError in ``exc``'s chain of causes, if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, EdgeplugError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def lower(
    model_or_ep: torch.nn.Module | ExportedProgram,
    example_inputs: Sequence[Any],
    backend: str | Backend,
    *,
    verify: bool = False,
    dry_run: bool = False,
    model_name: Optional[str] = None,
    progress: Optional[Progress] = None,
) -> LoweringResult:
    """Lower a model (or aten-dialect ExportedProgram) for ``backend``.

    Returns a ``LoweringResult``; ``.save(path)`` writes the .pte. With
    ``dry_run`` everything but serialization runs and the report says what
    would be delegated. With ``verify`` the lowered program is executed and
    compared against eager.
    """
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
    from executorch.exir.pass_manager import ExportedProgramPassManager

    from edgeplug.partition import CorePartitioner

    b = _resolve(backend)
    say = progress or (lambda msg: None)
    if not dry_run:
        b.require_available()
    example_inputs = tuple(example_inputs)
    stages: list[StageTiming] = []
    label = model_name or type(model_or_ep).__name__

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        say(f"[{b.name}] {name} ...")
        t = time.perf_counter()
        try:
            value = fn()
        except EdgeplugError:
            raise
        except Exception as exc:
            ours = _edgeplug_cause(exc)
            if ours is not None:  # e.g. a PassError executorch's pass manager wrapped
                raise ours
            raise LoweringError(f"stage {name!r} failed for backend {b.name!r}: {type(exc).__name__}: {exc}") from exc
        stages.append(StageTiming(stage=name, seconds=time.perf_counter() - t))
        return value

    if isinstance(model_or_ep, ExportedProgram):
        ep = model_or_ep
        eager_module = ep.module()
    else:
        eager_module = model_or_ep
        ep = timed("export", lambda: torch.export.export(model_or_ep, example_inputs))
    with torch.no_grad():
        eager_outputs = _flatten(eager_module(*example_inputs))

    ep = timed("export passes", lambda: transform(ep, b))

    clock: dict[str, float] = {}
    edge_stage = _EdgeStage(b, clock, say)
    partitioner = CorePartitioner(b, dry_run=dry_run)

    def to_edge_and_partition():
        # the backend's own scope for partitioning and preprocess (BackendSpec.lowering_context)
        scope = b.spec.lowering_context() if b.spec.lowering_context is not None else contextlib.nullcontext()
        try:
            with scope:
                return to_edge_transform_and_lower(
                    ep,
                    transform_passes=ExportedProgramPassManager([edge_stage.make()]),
                    partitioner=[partitioner],
                    # a dry run keeps whole ops it then does not delegate: skip the edge-IR check there
                    compile_config=EdgeCompileConfig(_check_ir_validity=not dry_run),
                )
        except Exception as exc:
            if partitioner.stranded:  # executorch's "was not decomposed or delegated", said fully
                raise LoweringError(partitioner.stranded_message()) from exc
            raise

    t0 = time.perf_counter()
    edge = timed("to_edge", to_edge_and_partition)
    if "edge_start" in clock:
        # split the combined stage for the report
        stages.pop()
        stages.append(StageTiming(stage="to_edge", seconds=clock["edge_start"] - t0))
        stages.append(StageTiming(stage="edge passes + fusion", seconds=clock["edge_end"] - clock["edge_start"]))
        stages.append(StageTiming(stage="partition + delegate", seconds=time.perf_counter() - clock["edge_end"]))

    edge_ep = edge.exported_program()
    default_reason = f"no reason recorded by the {b.name} partitioner"
    if dry_run:
        parts = [
            PartitionSummary(tag=p.tag, backend_id=p.backend_id, nodes=len(p.nodes), ops=dict(p.ops))
            for p in partitioner.partitions
        ]
        delegated: Counter = Counter()
        for p in partitioner.partitions:
            delegated.update(p.ops)
        tagged = {n for p in partitioner.partitions for n in p.nodes}
        cpu = _cpu_nodes(edge_ep.graph_module, partitioner.cpu_reasons, default_reason, tagged)
    else:
        parts, delegated = _count_delegated(edge_ep)
        cpu = _cpu_nodes(edge_ep.graph_module, partitioner.cpu_reasons, default_reason)

    report = LoweringReport(
        model=label,
        backend=b.name,
        distribution=f"{b.distribution} {b.version}".strip(),
        dry_run=dry_run,
        partitions=parts,
        delegated_ops=dict(delegated),
        cpu_ops=dict(Counter(c.op for c in cpu)),
        cpu_nodes=cpu,
        fusions=edge_stage.fusions,
        kept_whole_on_cpu=[CpuNode(node=k.node, op=k.op, reason=k.reason) for k in partitioner.stranded],
        decomposed_instead=[CpuNode(node=n, op=op, reason=why) for n, (op, why) in partitioner.decomposed.items()],
    )
    if partitioner.stranded:
        report.notes.append(partitioner.stranded_message())
    result = LoweringResult(report=report, exported_program=ep, edge=edge, example_inputs=example_inputs, eager_outputs=eager_outputs)
    if not dry_run:
        result.program = timed("serialize .pte", lambda: edge.to_executorch())
        _ = result.program.buffer
    if verify:
        if dry_run:
            report.notes.append("verification skipped: a dry run produces no program to run")
        else:
            report.verification = timed("verify", lambda: verify_result(result, b))
    report.stages = stages
    return result


def verify_result(result: LoweringResult, backend: str | Backend) -> Verification:
    """Run the lowered program and compare each output against eager."""
    backend = _resolve(backend)  # edgeplug.verify(result, "webgpu") takes a name too
    if backend.spec.verify == "pte":
        from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

        module = _load_for_executorch_from_buffer(result.buffer)
        outs = _flatten(module.forward(tuple(result.example_inputs)))
        method, adapter, note = "pte", "executorch runtime (host CPU)", ""
    elif backend.spec.verify == "kernels":
        from edgeplug.runtime import run_lowered

        run = run_lowered(result, backend)
        outs, method, adapter, note = run.outputs, "kernels", run.adapter, run.note
    else:
        raise VerificationError(
            f"backend {backend.name!r} has no way to run its programs on this host "
            "(its BackendSpec.verify is 'none'); run the .pte on the device instead"
        )
    eager = result.eager_outputs
    if len(outs) != len(eager):
        raise VerificationError(f"the lowered program returned {len(outs)} outputs, eager returned {len(eager)}")
    checks = []
    for i, (a, e) in enumerate(zip(outs, eager)):
        if tuple(a.shape) != tuple(e.shape):
            raise VerificationError(f"output {i}: lowered shape {tuple(a.shape)} != eager shape {tuple(e.shape)}")
        diff = (a.to(torch.float64) - e.detach().to(torch.float64)).abs().max().item() if a.numel() else 0.0
        checks.append(OutputCheck(output=i, max_abs_diff=diff, shape=list(e.shape)))
    return Verification(method=method, adapter=adapter, outputs=checks, note=note)
