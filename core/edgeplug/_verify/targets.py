"""Running a lowered program here: the ``.pte`` in executorch's runtime (``run_pte``), or its
delegates on the backend's host kernels (``run_kernels``, through ``edgeplug._verify.host``)."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
import torch.utils._pytree as pytree

from edgeplug import _executorch
from edgeplug._backend import Backend
from edgeplug._eager import _tensors
from edgeplug._errors import RuntimeRefusedError, VerificationError
from edgeplug._inputs import ExampleInputs, runtime_inputs
from edgeplug._result import LoweringResult
from edgeplug._verify.host import HostProgram, run_lowered
from edgeplug._verify.where import Target, choose_target, find_device_runtime, unrunnable  # noqa: F401  (re-exported)


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
    steps: list[list[torch.Tensor]] = []
    try:
        module = _PteModule(result)
        outs = _tensors(module(copy.deepcopy(_runtime_inputs(result))))
        for call in calls:
            steps.append(_tensors(module(copy.deepcopy(_runtime_inputs(result, call)))))
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
    run = run_lowered(_with_copied_inputs(result), backend, copy.deepcopy(list(calls)))
    return _Run(run.outputs, "kernels", run.adapter, run.note, dict(run.mutated_buffers), steps=run.steps)


def _with_copied_inputs(result: LoweringResult) -> LoweringResult:
    # the host interpreter may change inputs in place, as the model does: give it copies
    return LoweringResult(
        report=result.report, exported_program=result.exported_program, edge=result.edge, program=result.program,
        args=copy.deepcopy(result.args), kwargs=copy.deepcopy(result.kwargs), reference=result.reference,
    )


def run_device_runtime(result: LoweringResult, runtime: Any, calls: Sequence[ExampleInputs] = ()) -> _Run:
    """Run the ``.pte`` in the backend's own runtime: the example inputs, then each of ``calls``, the program
    loaded once so its buffers persist between calls."""
    flat = [_runtime_inputs(result), *(_runtime_inputs(result, c) for c in calls)]
    outs, adapter = runtime.run(result.buffer, result.data_buffer, flat)
    outs = [_tensors(o) for o in outs]
    return _Run(outs[0], "pte", f"{runtime.name} on {adapter}", steps=outs[1:])


def _emulation_note(target: Target) -> str:
    return f"host emulation ({target.why_not})" if target.why_not else ""


def run_program(
    result: LoweringResult, backend: Backend, calls: Sequence[ExampleInputs] = (), target: Optional[Target] = None,
) -> _Run:
    """Run the lowered program where ``target`` says (by default ``choose_target(backend)``): the backend's own
    runtime, the ``.pte`` in executorch's runtime, or the delegates on host kernels; either way then each of
    ``calls``, the program's buffers kept between calls."""
    target = target or choose_target(backend)
    if target.runtime is not None:
        return run_device_runtime(result, target.runtime, calls)
    if target.method == "pte":
        return run_pte(result, calls)
    if target.method == "kernels":
        run = run_kernels(result, backend, calls)
        run.note = "; ".join(x for x in (_emulation_note(target), run.note) if x)
        return run
    raise VerificationError(
        f"backend {backend.name!r} has no way to run its programs on this host: {unrunnable(backend, target)}; "
        "run the .pte on the device instead"
    )


# -- one program loaded, called again and again (greedy generation) --------------------------------------

class LoadedProgram:
    """A lowered program loaded once where ``target`` says, called on flat inputs (in the program's order) one
    call at a time, its buffers kept between calls; ``label`` names what runs it. Use as a context manager."""

    def __init__(self, result: LoweringResult, backend: Backend, target: Target) -> None:
        self.result, self.backend, self.target = result, backend, target
        self._call: Any = None
        self._close: Any = None
        self.label = ""

    def __enter__(self) -> "LoadedProgram":
        result, target = self.result, self.target
        if target.runtime is not None:
            opened = getattr(target.runtime, "open", None)
            if opened is None:
                raise VerificationError(
                    f"{target.runtime.name} runs calls given in advance only (its device runtime has no open()), "
                    "so greedy generation, whose next input is the last call's token, cannot run in it"
                )
            session = opened(result.buffer, result.data_buffer)
            self._call, self._close = session.run, session.close
            self.label = f"{target.runtime.name} on {session.adapter}"
        elif target.method == "pte":
            self._call = _PteModule(result)
            self.label = "executorch runtime (host CPU)"
        elif target.method == "kernels":
            host = HostProgram(_with_copied_inputs(result), self.backend)
            spec = result.exported_program.call_spec.in_spec

            def call(flat: list[Any]) -> list[torch.Tensor]:
                args, kwargs = pytree.tree_unflatten(list(flat), spec)
                return host(ExampleInputs(tuple(args), dict(kwargs)))

            self._call = call
            self.label = "; ".join(x for x in (f"host emulation on {host.adapter}", target.why_not) if x)
        else:
            raise VerificationError(
                f"backend {self.backend.name!r} has no way to run its programs on this host: "
                f"{unrunnable(self.backend, target)}; run the .pte on the device instead"
            )
        return self

    def __call__(self, flat: list[Any]) -> list[torch.Tensor]:
        return [t for t in pytree.tree_leaves(self._call(copy.deepcopy(list(flat)))) if isinstance(t, torch.Tensor)]

    def __exit__(self, *exc: Any) -> None:
        if self._close is not None:
            self._close()


class _PteModule:
    """The .pte loaded in executorch's runtime, its mutable buffers kept between calls."""

    def __init__(self, result: LoweringResult) -> None:
        # executorch's runtime (a native library): loaded only where a .pte is run on the host
        if "quantized_decomposed" in " ".join(str(n.target) for n in result.program.exported_program().graph.nodes):
            import executorch.kernels.quantized  # noqa: F401  registers the quantized ops' kernels

        self._weights = result.data_buffer  # the runtime reads it in place: kept referenced while it runs
        self.module = _executorch.load_pte(result.buffer, self._weights)

    def __call__(self, flat: list[Any]) -> Any:
        return self.module.forward(flat)
