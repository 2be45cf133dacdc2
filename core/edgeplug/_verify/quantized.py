"""Verifying a quantized program: against the quantized model's eager output, each output held
to steps of its output scale (or, for dynamically quantized activations, to a fraction of its
magnitude), with |lowered - float| and the cosine to the float model in the report."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.utils._pytree as pytree

from edgeplug._errors import EdgeplugError, RuntimeRefusedError, VerificationError
from edgeplug._failures import first_line
from edgeplug._quantize.program import QuantizationInfo, output_steps
from edgeplug._records import QuantScheme
from edgeplug._report.records import QuantizationSummary, Verification
from edgeplug._verify.compare import check_tolerance, compare_output
from edgeplug._verify.targets import Target, choose_target, run_program
from edgeplug._verify.steps import decode_steps, start_state_note, steps_note


#: default verification tolerance of a quantized output, in steps of its output scale: the
#: lowered program rounds at every requantization as the reference does, but a value one step
#: off at one layer moves the next layers' outputs too (measured on XNNPACK: 1 step for the MLP
#: and the Gemma-style block, 4 for the 2-layer Llama); a wrong weight or op is tens of steps off
QUANT_STEPS = 8


#: default verification tolerance of an output of a source-transform scheme with dynamically
#: quantized activations, as a fraction of the output's largest magnitude: there is no static
#: output scale, and XNNPACK picks each row's activation scale and rounds as torchao's reference
#: does but not bit for bit. Measured on XNNPACK 8da4w, |lowered - quantized| / max|logit|: 0.6%,
#: 1.2%, 2.2% (zoo llama, qwen3, gemma3, 2 layers), 2.1% (the built-in llama example); the float
#: error is 11-12% and one int4 group of one layer negated and scaled is 26% (the xnnpack test)
DYNAMIC_RELATIVE = 0.05


def _run_lowered(result: Any, backend: Any, info: Optional[QuantizationInfo], target: Target, calls: list) -> Any:
    """The lowered program's run (the example inputs, then each of ``calls``), as ``edgeplug.verify`` runs it;
    a refusal says whose quantizer made it."""
    try:
        return run_program(result, backend, calls, target)
    except RuntimeRefusedError as exc:  # the runtime's refusal, explained with the quantizer that made it
        raise _refused(exc, info, backend) from exc
    except EdgeplugError:
        raise
    except Exception as exc:
        raise _refused(exc, info, backend) from exc


def _refused(exc: BaseException, info: Any, backend: Any) -> VerificationError:
    """The runtime refused a quantized program: say whose quantizer made it and what to do."""
    if info is not None and info.backend != backend.name:
        why = (
            f"the program was quantized with {info.backend}'s quantizer (scheme {info.scheme!r}), whose "
            f"quantized ops {backend.name} does not take as they are"
        )
    else:
        why = "the backend's runtime refused the quantized program"
    own = ", ".join(s.scheme for s in backend.records(QuantScheme)) or "none"
    return VerificationError(
        f"running the lowered quantized program with {backend.name}'s runtime failed: {first_line(exc)}; "
        f"{why}. Quantize for {backend.name} itself (its schemes: {own}), e.g. "
        f"`edgeplug lower MODEL --backend {backend.name} --quantize SCHEME --verify`"
    )


def _same_inputs(a: tuple, b: tuple) -> bool:
    la, lb = pytree.tree_leaves(a), pytree.tree_leaves(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor) and not (x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)):
            return False
    return True


def verify_quantized(
    result: Any, backend: Any, tolerance: Optional[float] = None, target: Optional[Target] = None,
) -> Verification:
    """``edgeplug.verify`` for a quantized program; fills ``result.report.quantization`` too.

    The reference is the quantized model's eager output (``result``'s
    reference: the quantized model is what was lowered). Each output whose value a
    dequantize produces is held to ``QUANT_STEPS`` steps of its scale unless
    ``tolerance`` is given; other outputs (weight-only schemes) to the float
    default. A program that keeps state (a KV cache) runs its prefill and then
    ``DECODE_STEPS`` decode steps in one loaded program, its buffers carried,
    each step against the quantized model's from the same state and held to the
    same rule. |lowered - float| is reported where ``result.quantization`` holds
    the float model's outputs for the same inputs. ``target`` says where it runs
    (by default ``choose_target(backend)``).
    """
    tolerance = check_tolerance(tolerance)
    target = target or choose_target(backend)
    info = result.quantization
    steps, why_not = decode_steps(result) if target.method in ("pte", "kernels") else ([], "")
    run = _run_lowered(result, backend, info, target, [s.inputs for s in steps])
    outs, note = run.outputs, run.note
    reference = list(result.eager_outputs)
    if len(outs) != len(reference):
        raise VerificationError(
            f"the lowered program returned {len(outs)} outputs, the quantized model returned {len(reference)}"
        )
    scales = output_steps(result.exported_program)
    # activations quantized at run time: edgeplug's source-transform scheme, or a program quantized
    # elsewhere (torchao's quantize_, as optimum-executorch's 8da4w) whose graph chooses them per call
    dynamic = (
        bool(info.kind == "source_transform" and info.activation_bits) if info is not None
        else chooses_activation_qparams(result.exported_program)
    )
    scales = scales if len(scales) == len(reference) else [None] * len(reference)
    prefix = "prefill: " if steps else ""
    checks = _checks(outs, reference, scales, dynamic, tolerance, [f"{prefix}output {i}" if steps else "" for i in range(len(reference))])
    per_output = [c.max_abs_diff for c in checks]
    for k, (step, lowered) in enumerate(zip(steps, run.steps), start=1):
        lowered = list(lowered)[len(lowered) - len(step.outputs):] if len(lowered) > len(step.outputs) else list(lowered)
        if len(lowered) != len(step.outputs):
            raise VerificationError(
                f"decode step {k}: the lowered program returned {len(lowered)} outputs, the quantized model "
                f"returned {len(step.outputs)}"
            )
        found = _checks(lowered, step.outputs, scales, dynamic, tolerance,
                        [f"decode {k}: output {i}" for i in range(len(step.outputs))])
        per_output = [max(a, c.max_abs_diff) for a, c in zip(per_output, found)]
        checks += found
    summary = result.report.quantization or (info.summary() if info is not None else None)
    if summary is None:
        summary = QuantizationSummary(quantizer_backend="unknown", scheme="unknown", description="quantized outside edgeplug")
    summary.reference = "the quantized model's eager output"
    summary.versus_quantized = per_output
    if info is not None and info.float_outputs and _same_inputs(info.inputs, (result.args, result.kwargs)):
        summary.versus_float = [
            (a.detach().double() - f.detach().double()).abs().max().item() if a.shape == f.shape and a.numel() else float("nan")
            for a, f in zip(outs, info.float_outputs)
        ]
        summary.cosine_to_float = [_cosine(a, f) for a, f in zip(outs, info.float_outputs)]
        summary.quantized_cosine_to_float = [_cosine(e, f) for e, f in zip(reference, info.float_outputs)]
    result.report.quantization = summary
    notes = [note, why_not, start_state_note(result) if target.method == "pte" else ""]
    if steps:
        notes.append(steps_note(steps, target.method))
    notes.append("reference: the quantized model's eager output")
    return Verification(method=run.method, adapter=run.adapter, outputs=checks, note="; ".join(x for x in notes if x))


def _checks(
    outs: list, reference: list, scales: list, dynamic: bool, tolerance: Optional[float], names: list[str],
) -> list:
    """One call's outputs against the quantized model's: each held to ``QUANT_STEPS`` steps of its output scale,
    or, for dynamically quantized activations, ``DYNAMIC_RELATIVE`` of its own largest magnitude (this call's),
    unless ``tolerance`` is given."""
    checks = []
    for i, (a, e, step, name) in enumerate(zip(outs, reference, scales, names)):
        why = None
        tol = tolerance
        if tol is None and step is not None:
            tol = QUANT_STEPS * step
            why = f"default for a quantized output: {QUANT_STEPS} steps of its output scale {step:.4g}"
        elif tol is None and dynamic and e.is_floating_point():
            largest = e.detach().abs().max().item() if e.numel() else 0.0
            tol = DYNAMIC_RELATIVE * largest
            why = (
                f"default for dynamically quantized activations: {DYNAMIC_RELATIVE:.0%} of the output's largest "
                f"magnitude {largest:.4g} (no static output scale)"
            )
        check = compare_output(i, a, e, tol, name)
        if why is not None:
            check = check.model_copy(update={"tolerance_reason": why})
        checks.append(check)
    return checks


def chooses_activation_qparams(ep: Any) -> bool:
    """Whether the program picks quantization parameters at run time (dynamically quantized activations):
    a ``choose_qparams`` op (torchao's or quantized_decomposed's) in its graph."""
    return any(n.op == "call_function" and "choose_qparams" in str(n.target) for n in ep.graph.nodes)


def _cosine(a: Any, b: Any) -> float:
    """Cosine similarity of two outputs taken as flat vectors (NaN where shapes differ, or for a zero vector)."""
    if a.shape != b.shape or not a.numel() or not (a.is_floating_point() and b.is_floating_point()):
        return float("nan")
    x, y = a.detach().double().flatten(), b.detach().double().flatten()
    norms = x.norm() * y.norm()
    return float("nan") if norms == 0 else float((x @ y / norms).item())

