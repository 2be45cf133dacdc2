"""Verification over several calls, for a program that keeps state in buffers (a KV cache):
the decode steps after the example inputs' call, eager's outputs for each, and their comparison."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from executorch.exir.lowered_backend_module import get_lowered_submodules
from torch.export import ExportedProgram

from edgeplug._failures import first_line
from edgeplug._inputs import ExampleInputs, decode_inputs
from edgeplug._report.records import OutputCheck
from edgeplug._result import LoweringResult
from edgeplug._verify.compare import compare_outputs


#: decode steps verification runs after the example inputs' call, for a program that keeps state in buffers
DECODE_STEPS = 3


@dataclass
class _Step:
    """One further call verification makes (a decode step): its inputs and eager's outputs."""

    inputs: ExampleInputs
    outputs: list[torch.Tensor]


def keeps_state(ep: ExportedProgram) -> bool:
    """Whether the lowered program writes buffers (a KV cache), at the top level or inside a delegate."""
    if ep.graph_signature.buffers_to_mutate:
        return True
    return any(
        s.kind.name == "BUFFER_MUTATION"
        for _, lowered, _ in get_lowered_submodules(ep.graph_module)
        for s in lowered.original_module.graph_signature.output_specs
    )


def written_buffers(ep: ExportedProgram) -> set[str]:
    """The buffers the lowered program writes: at the top level, or inside a delegate."""
    written = set(ep.graph_signature.buffers_to_mutate.values())
    for _, lowered, _ in get_lowered_submodules(ep.graph_module):
        written.update(
            s.target for s in lowered.original_module.graph_signature.output_specs
            if s.kind.name == "BUFFER_MUTATION" and s.target
        )
    return written


def unwritten_state(result: LoweringResult) -> list[OutputCheck]:
    """A failing check for each buffer the eager call changed that the lowered program never writes: a KV
    cache whose update torch.export did not capture stays where it started in the program, so the example
    call agrees and every later call computes from stale state (the decode steps would never run)."""
    ref = result.reference
    if ref is None or ref.model is None or result.edge is None:
        return []
    written = written_buffers(result.lowered_program())
    checks: list[OutputCheck] = []
    for name, after in sorted(ref.buffers_after.items()):
        before = ref.model.initial.get(name)
        if name in written or before is None or before.shape != after.shape or torch.equal(before, after):
            continue
        moved = (after.double() - before.double()).abs().max() if after.numel() and not after.is_complex() else 0.0
        checks.append(OutputCheck(
            output=len(checks), name=f"buffer {name!r} (changed by the model's call)",
            max_abs_diff=float(moved) if math.isfinite(float(moved)) else float("inf"),
            shape=list(after.shape), dtype=str(after.dtype).removeprefix("torch."),
            problems=[
                "the model's call changes this buffer (a KV cache, a counter), but the lowered program never "
                "writes it, so its state stays where it started and every later call computes from stale state: "
                "torch.export did not capture the write (one made only when not torch.compiler.is_exporting(), "
                "through .data, or by assigning a new tensor to a plain attribute). Write the buffer in place in "
                "forward (self.cache[...] = x, or .copy_) so that the exported program holds the update"
            ],
        ))
    return checks


def decode_steps(result: LoweringResult, count: int = DECODE_STEPS) -> tuple[list[_Step], str]:
    """For a program that keeps state in buffers: ``count`` calls continuing the example inputs (the next
    tokens, ``edgeplug._inputs.decode_inputs``) with eager's outputs for each, replayed on the eager model
    from its first state; and why fewer were made (empty when all were)."""
    ref = result.reference
    if ref is None or ref.model is None or result.edge is None:
        return [], ""
    ep = result.lowered_program()
    if not keeps_state(ep):
        return [], ""
    calls = decode_inputs(ep, ExampleInputs(result.args, result.kwargs), count, sizes_from=result.exported_program)
    if not calls:
        return [], "decode steps not run: the program's inputs do not match the example inputs' leaves"
    steps: list[_Step] = []
    eager = ref.model
    eager.reset()
    try:
        eager(ExampleInputs(result.args, result.kwargs))
        for call in calls:
            steps.append(_Step(call, eager(call).outputs))
    except Exception as exc:
        return steps, (
            f"decode steps stopped after {len(steps)}: eager raised {first_line(exc)} on step {len(steps) + 1} "
            f"({calls[len(steps)].describe()})"
        )
    finally:
        eager.reset()
    return steps, ""


def compare_steps(steps: Sequence[_Step], runs: Sequence[list[torch.Tensor]], tolerance: Optional[float]) -> list:
    checks = []
    for i, (step, outs) in enumerate(zip(steps, runs), start=1):
        outs = list(outs)[len(outs) - len(step.outputs):] if len(outs) > len(step.outputs) else list(outs)
        names = [f"decode {i}: output {j}" for j in range(len(step.outputs))]
        checks += compare_outputs(outs, step.outputs, tolerance, names)
    return checks


def buffers_the_pte_starts_at_zero(result: LoweringResult) -> list[str]:
    """Buffers the program writes whose value in the model is not zero: executorch's runtime starts a
    mutable buffer without the model's value (the .pte holds none for it), so the first call differs."""
    ref = result.reference
    if ref is None or ref.model is None or result.edge is None:
        return []
    written = set(result.lowered_program().graph_signature.buffers_to_mutate.values())
    return sorted(n for n, t in ref.model.initial.items() if n in written and bool(torch.count_nonzero(t)))


def start_state_note(result: LoweringResult) -> str:
    """For a ``.pte`` run: the note naming each buffer the program writes that the model holds non-zero (the
    runtime starts it without that value), or empty."""
    nonzero = buffers_the_pte_starts_at_zero(result)
    if not nonzero:
        return ""
    return (
        f"the program writes buffer{'s' if len(nonzero) > 1 else ''} {', '.join(map(repr, nonzero))}, which the "
        "model holds non-zero; executorch's runtime starts a mutable buffer without that value (the .pte "
        "carries none), so eager and the .pte start from different states: reset the buffer to zeros before "
        "lowering, or make it a constant if the program only reads it"
    )


def steps_note(steps: Sequence[_Step], method: str = "pte") -> str:
    where = (
        "ran through one loaded program, its buffers kept between calls" if method == "pte"
        else "ran on the host kernels, each buffer the program writes back and each one a delegate updates "
        "carried to the next call"
    )
    return f"prefill and {len(steps)} decode steps {where}; each decode step: {steps[0].inputs.describe()}"

