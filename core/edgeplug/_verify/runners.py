"""Running a lowered program here: the ``.pte`` in executorch's runtime (``run_pte``), or its
delegates on the backend's host kernels (``run_kernels``, through ``edgeplug._verify.host``)."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from edgeplug._backend import Backend
from edgeplug._eager import _tensors
from edgeplug._errors import RuntimeNotFound, RuntimeRefusedError, VerificationError
from edgeplug._inputs import ExampleInputs, runtime_inputs
from edgeplug._result import LoweringResult


def _runtime_inputs(result: LoweringResult, given: Optional[ExampleInputs] = None) -> list[Any]:
    """``given`` (by default the result's example inputs) as the runtime takes them: flat, in the program's order."""
    return runtime_inputs(result.exported_program, given or ExampleInputs(result.args, result.kwargs))


@dataclass
class _Run:
    outputs: list[torch.Tensor]
    method: str
    adapter: str
    note: str = ""
    #: buffer name -> value after the run, where the runner can see it
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    #: the outputs of each further call (decode steps), in order
    steps: list[list[torch.Tensor]] = field(default_factory=list)


#: executorch's runtime error codes (runtime/core/error.h) a .pte commonly fails with
_RUNTIME_ERRORS = {
    0x14: "OperatorMissing: an op of the program has no kernel in the runtime executorch's Python "
    "package links (its log above says which: 'Missing operator'); the .pte may still run on a "
    "runtime built with that kernel",
    # an input the program does not take, or an op's arguments its kernel refuses (an in-place index_put_
    # given broadcast values): the runtime's log above says which
    0x12: "InvalidArgument: an input, or the arguments of an op at run time, are not what the program or the "
    "op's kernel takes (its log above says which)",
    0x23: "InvalidProgram: the runtime could not read the program",
    0x30: "DelegateInvalidCompatibility: a delegate's payload is not one this runtime's backend reads",
}


def run_pte(result: LoweringResult, calls: Sequence[ExampleInputs] = ()) -> _Run:
    """Run the .pte in executorch's runtime on the example inputs, then on each of ``calls`` with the same
    loaded program (its mutable buffers persist between calls, as on a device); ``_Run.steps`` holds the
    outputs of each of ``calls``."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    if "quantized_decomposed" in " ".join(str(n.target) for n in result.program.exported_program().graph.nodes):
        import executorch.kernels.quantized  # noqa: F401  registers the quantized ops' kernels with the runtime

    steps: list[list[torch.Tensor]] = []
    try:
        # the runtime reads the weights' data file (external weights) in place: it stays referenced here
        # while the module runs
        weights = result.data_buffer
        module = _load_for_executorch_from_buffer(result.buffer, weights)
        outs = _tensors(module.forward(copy.deepcopy(_runtime_inputs(result))))
        for call in calls:
            steps.append(_tensors(module.forward(copy.deepcopy(_runtime_inputs(result, call)))))
    except RuntimeError as exc:
        code = re.search(r"error:? (0x[0-9a-fA-F]+)", str(exc))
        meaning = _RUNTIME_ERRORS.get(int(code.group(1), 16)) if code else None
        raise RuntimeRefusedError(
            f"executorch's runtime could not run the .pte: {str(exc).strip().splitlines()[0]}"
            + (f" ({meaning})" if meaning else "")
            + ". This is the runtime's refusal, not a lowering error of edgeplug's or a plugin's; "
            "lower without --verify to write the .pte anyway"
            + (f" (it ran {len(steps) + 1} calls before this one)" if steps else "")
        ) from exc
    return _Run(outs, "pte", "executorch runtime (host CPU)", steps=steps)


def run_kernels(result: LoweringResult, backend: Backend, calls: Sequence[ExampleInputs] = ()) -> _Run:
    """Run the delegates on ``backend``'s host kernels: the example inputs, then each of ``calls``, the
    program's buffers carried from one call to the next (``edgeplug._verify.host.run_lowered``)."""
    from edgeplug._verify.host import run_lowered

    run = run_lowered(_with_copied_inputs(result), backend, copy.deepcopy(list(calls)))
    return _Run(run.outputs, "kernels", run.adapter, run.note, dict(run.mutated_buffers), steps=run.steps)


def _with_copied_inputs(result: LoweringResult) -> LoweringResult:
    # the host interpreter may change inputs in place, as the model does: give it copies
    return LoweringResult(
        report=result.report, exported_program=result.exported_program, edge=result.edge, program=result.program,
        args=copy.deepcopy(result.args), kwargs=copy.deepcopy(result.kwargs), reference=result.reference,
    )


def find_device_runtime(backend: Backend) -> tuple[Any, str]:
    """``backend``'s own runtime (``BackendSpec.device_runtime``) if one is on this machine, else None and
    why not (empty when the backend declares none)."""
    factory = backend.spec.device_runtime
    if factory is None:
        return None, ""
    try:
        return factory(), ""
    except RuntimeNotFound as exc:
        return None, str(exc)


def verify_method_of(backend: Backend) -> str:
    """How the backend's programs run here: "pte" when its own runtime is found, else its ``verify_method``."""
    return "pte" if find_device_runtime(backend)[0] is not None else backend.spec.verify_method


def run_device_runtime(result: LoweringResult, runtime: Any, calls: Sequence[ExampleInputs] = ()) -> _Run:
    """Run the ``.pte`` in the backend's own runtime: the example inputs, then each of ``calls``, the program
    loaded once so its buffers persist between calls."""
    flat = [_runtime_inputs(result), *(_runtime_inputs(result, c) for c in calls)]
    outs, adapter = runtime.run(result.buffer, result.data_buffer, flat)
    outs = [_tensors(o) for o in outs]
    return _Run(outs[0], "pte", f"{runtime.name} on {adapter}", steps=outs[1:])


def run_program(result: LoweringResult, backend: Backend, calls: Sequence[ExampleInputs] = ()) -> _Run:
    """Run the lowered program in the backend's own runtime where one is found (``BackendSpec.device_runtime``),
    else as its ``BackendSpec.verify_method`` says: the ``.pte``, or the delegates on host kernels; either way
    then each of ``calls``, the program's buffers kept between calls."""
    runtime, why_not = find_device_runtime(backend)
    if runtime is not None:
        return run_device_runtime(result, runtime, calls)
    method = backend.spec.verify_method
    if method == "kernels" and why_not:
        run = run_kernels(result, backend, calls)
        run.note = "; ".join(x for x in (f"host emulation ({why_not})", run.note) if x)
        return run
    if method == "pte":
        return run_pte(result, calls)
    if method == "kernels":
        return run_kernels(result, backend, calls)
    raise VerificationError(
        f"backend {backend.name!r} has no way to run its programs on this host "
        "(its BackendSpec.verify_method is 'none'); run the .pte on the device instead"
    )
