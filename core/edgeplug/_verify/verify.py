"""``edgeplug.verify``: run a lowered program here, compare each output with eager, and explain
the result. The one place that chooses how: float or quantized, ``.pte`` or host kernels."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from edgeplug._backend import Backend, given_backend
from edgeplug._errors import VerificationError
from edgeplug._quantize.program import is_quantized
from edgeplug._report.records import Verification
from edgeplug._result import LoweringResult
from edgeplug._verify.compare import compare_outputs
from edgeplug._verify.greedy import greedy_check
from edgeplug._verify.quantized import verify_quantized
from edgeplug._verify.targets import Target, choose_target, run_program, unrunnable
from edgeplug._verify.steps import compare_steps, decode_steps, start_state_note, steps_note, unwritten_state


def refuse_verify_without_runtime(backend: Backend) -> None:
    """Refuse verification before any work for a backend whose programs cannot run here (``verify_method="none"``,
    or "pte" where neither its own runtime nor ExecuTorch's Python runtime has its delegate: ``unrunnable``)."""
    why = unrunnable(backend)
    if why:
        raise VerificationError(
            f"backend {backend.name!r} cannot verify here: {why}. Lower without --verify (verify=False) to write "
            "the .pte and run it on the device, or use --dry-run to see the partitions; nothing was done"
        )


def _labelled_reference(result: LoweringResult, count: int) -> tuple[list[torch.Tensor], list[str]]:
    """The reference for ``count`` lowered outputs: user outputs, plus inputs the program mutates when returned."""
    ref = result.reference
    outputs = list(ref.outputs)
    names = [""] * len(outputs)
    if count == len(outputs) or result.edge is None:
        return outputs, names
    ep = result.lowered_program()
    user_inputs = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    mutated, values, labels = [], [], []
    for spec in ep.graph_signature.output_specs:
        if spec.kind.name == "USER_INPUT_MUTATION" and spec.target in user_inputs:
            i = user_inputs.index(spec.target)
            if i < len(ref.inputs_after) and isinstance(ref.inputs_after[i], torch.Tensor):
                mutated.append(spec.target)
                values.append(ref.inputs_after[i])
                labels.append(f"input {spec.target!r} (changed in place)")
    if count == len(outputs) + len(values):  # the runtime returns mutated inputs first, as the program does
        return [*values, *outputs], [*labels, *names]
    return outputs, names


def _quantized(result: LoweringResult) -> bool:
    return (
        result.quantization is not None or result.report.quantization is not None
        or is_quantized(result.exported_program)
    )


def verify_lowering(
    result: LoweringResult, backend: Backend, *, tolerance: Optional[float] = None,
    reference: Optional[Sequence[torch.Tensor]] = None, verify_steps: Optional[int] = None,
) -> Verification:
    """``edgeplug.verify``: run the lowered program and compare each output with eager.

    ``backend`` is the ``Backend`` the façade resolved (``edgeplug._facade.verify`` checks the flags,
    once, and resolves a name); ``BackendSpec.verify_method`` says
    how the program runs here. ``tolerance`` is the max |difference| accepted
    (default by output dtype; see ``edgeplug._verify.compare``); ``reference``
    replaces eager's outputs (e.g. a quantized model's). NaN and infinities
    are compared by position. ``Verification.passed`` says whether it held.

    With ``verify_steps`` (a program that keeps a KV cache), that many tokens are also
    generated greedily through the loaded program (where the other calls ran: the
    backend's own runtime, executorch's runtime or the host emulation) and through
    eager (the quantized model where quantized), and compared token for token:
    ``Verification.greedy`` (``edgeplug._verify.greedy``; ``GreedyCheck.runner``).
    """
    backend = given_backend(backend, "edgeplug._verify.verify")
    target = choose_target(backend)  # the backend's own runtime is looked up once, here
    if reference is None and _quantized(result):  # its reference is the quantized model, its tolerance its output scale
        v = verify_quantized(result, backend, tolerance, target)
        return _with_greedy(v, result, backend, target, verify_steps, tolerance)
    if reference is None and result.reference is None:
        raise VerificationError("this lowering result holds no eager reference: pass reference=[...] to compare with")
    method = target.method
    # a program that keeps state runs prefill then decode steps: the .pte's runtime and the host kernels'
    # runner both keep its buffers between calls
    steps, why_not = decode_steps(result) if reference is None and method in ("pte", "kernels") else ([], "")
    run = run_program(result, backend, [s.inputs for s in steps], target)
    outs = list(run.outputs)
    if reference is not None:
        expected, names = list(reference), [""] * len(reference)
    else:
        expected, names = _labelled_reference(result, len(outs))
        # state the model updates (a buffer the delegate owns) is compared once, as itself
        after = result.reference.buffers_after if result.reference is not None else {}
        for name, value in sorted(run.buffers.items()):
            if name in after:
                outs.append(value)
                expected.append(after[name])
                names.append(f"buffer {name!r} (updated in forward)")
    notes = [run.note, why_not]
    if reference is None and method == "pte":
        notes.append(start_state_note(result))
    if steps:
        names = [f"prefill: {n or f'output {i}'}" for i, n in enumerate(names)]
        notes.append(steps_note(steps, method))
    checks = compare_outputs(outs, expected, tolerance, names)
    if steps:
        checks += compare_steps(steps, run.steps, tolerance)
    note = "; ".join(x for x in notes if x)
    v = Verification(method=run.method, adapter=run.adapter, outputs=checks, note=note)
    return _with_greedy(v, result, backend, target, verify_steps, tolerance)


def _with_greedy(
    v: Verification, result: LoweringResult, backend: Backend, target: Target, steps: Optional[int],
    tolerance: Optional[float],
) -> Verification:
    """``v`` with a failing check for each buffer eager's call changes and the program never writes, and
    with the greedy check of ``steps`` tokens, where asked for, run where ``v``'s calls ran (``target``);
    its logits are held to the tolerance the example call's logits were (the quantized path's, in steps of the
    output scale or a fraction of the logits' magnitude)."""
    stale = unwritten_state(result)  # eager's state moves where the program's never does: no call can show it
    for check in stale:
        check.output = len(v.outputs)
        v.outputs.append(check)
    if steps is None:
        return v
    logits = next((o for o in v.outputs if len(o.shape) >= 2 and o.tolerance is not None), None)
    given = tolerance if tolerance is not None else (logits.tolerance if logits else None)
    v.greedy = greedy_check(result, backend, target, steps, given)
    return v
