"""Comparing a lowered program's outputs with a reference, in a way a NaN cannot fool.

``compare_outputs(lowered, reference, tolerance)`` is what ``edgeplug.verify``
uses, and what any other check (a quantized reference, a device run) can call
with its own reference outputs. Per output:

- NaN and infinities are compared by position: a NaN (or +inf, -inf) where the
  reference has none, or the reverse, fails the output, with its count;
- the largest |difference| is taken over the positions where both are finite;
- the tolerance is the one given, else a default by the reference's dtype
  (fp32/fp64: 1e-4; fp16/bf16: a few ulps at the output's magnitude;
  integers and booleans: exact), and the check says which it used and why.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from edgeplug.errors import EdgeplugError, VerificationError
from edgeplug.report import OutputCheck

#: default max |difference| for fp32 (and fp64) outputs
FP32_TOLERANCE = 1e-4
#: default for fp16/bf16 outputs: this many ulps (machine epsilons) at the output's magnitude
HALF_ULPS = 4


def check_tolerance(tolerance: Optional[float]) -> Optional[float]:
    """``tolerance`` if it is a usable one (finite, >= 0) or None; raises ``EdgeplugError`` otherwise."""
    if tolerance is None:
        return None
    value = float(tolerance)
    if not math.isfinite(value) or value < 0:
        raise EdgeplugError(
            f"the verification tolerance must be a finite number >= 0, not {tolerance!r} "
            "(leave it out for the default by output dtype)"
        )
    return value


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def default_tolerance(reference: torch.Tensor) -> tuple[float, str]:
    """``(tolerance, why)`` for an output whose reference is ``reference``."""
    dtype = reference.dtype
    if dtype in (torch.float16, torch.bfloat16):
        finite = reference.detach()[torch.isfinite(reference.detach())]
        magnitude = finite.abs().max().item() if finite.numel() else 0.0
        eps = torch.finfo(dtype).eps
        scale = max(magnitude, 1.0)
        value = HALF_ULPS * eps * scale
        return value, (
            f"default for {_dtype_name(dtype)}: {HALF_ULPS} ulps at the output's magnitude "
            f"({HALF_ULPS} x eps {eps:g} x max(|eager|={magnitude:.3g}, 1))"
        )
    if dtype.is_floating_point or dtype.is_complex:
        return FP32_TOLERANCE, f"default for {_dtype_name(dtype)} outputs"
    return 0.0, f"{_dtype_name(dtype)} output: must match exactly"


def _nonfinite_mismatches(a: torch.Tensor, e: torch.Tensor) -> tuple[list[str], int]:
    """Problems with NaN/inf placement, and how many non-finite values matched."""
    problems = []
    matched = 0
    for label, test in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        in_a, in_e = test(a), test(e)
        extra = int((in_a & ~in_e).sum())
        missing = int((in_e & ~in_a).sum())
        matched += int((in_a & in_e).sum())
        if extra:
            problems.append(f"{extra} {label} where eager has none")
        if missing:
            problems.append(f"{missing} {label} in eager that the lowered output lacks")
    return problems, matched


def compare_output(
    index: int, lowered: torch.Tensor, reference: torch.Tensor, tolerance: Optional[float] = None, name: str = ""
) -> OutputCheck:
    """One ``OutputCheck``: shape, NaN/inf by position, then the largest finite |difference|."""
    label = name or f"output {index}"
    if tuple(lowered.shape) != tuple(reference.shape):
        raise VerificationError(f"{label}: lowered shape {tuple(lowered.shape)} != eager shape {tuple(reference.shape)}")
    if tolerance is None:
        tol, why = default_tolerance(reference)
    else:
        tol, why = tolerance, "given"
    a = lowered.detach().to("cpu")
    e = reference.detach().to("cpu")
    if a.is_complex() or e.is_complex():
        a, e = torch.view_as_real(a.to(torch.complex128)), torch.view_as_real(e.to(torch.complex128))
    else:
        a, e = a.to(torch.float64), e.to(torch.float64)
    problems, matched = _nonfinite_mismatches(a, e)
    both = torch.isfinite(a) & torch.isfinite(e)
    diff = (a[both] - e[both]).abs().max().item() if bool(both.any()) else 0.0
    if diff > tol:
        problems.append(f"max |difference| {diff:.3e} > tolerance {tol:.3e}")
    return OutputCheck(
        output=index,
        name=name,
        shape=list(reference.shape),
        dtype=_dtype_name(reference.dtype),
        max_abs_diff=diff,
        tolerance=tol,
        tolerance_reason=why,
        nonfinite_matched=matched,
        problems=problems,
    )


def compare_outputs(
    lowered: Sequence[torch.Tensor],
    reference: Sequence[torch.Tensor],
    tolerance: Optional[float] = None,
    names: Optional[Sequence[str]] = None,
) -> list[OutputCheck]:
    """Compare each lowered output with its reference; raises ``VerificationError`` when the counts differ."""
    tolerance = check_tolerance(tolerance)
    if len(lowered) != len(reference):
        raise VerificationError(f"the lowered program returned {len(lowered)} outputs, eager returned {len(reference)}")
    names = list(names) if names is not None else [""] * len(reference)
    return [compare_output(i, a, e, tolerance, n) for i, (a, e, n) in enumerate(zip(lowered, reference, names))]


__all__ = ["FP32_TOLERANCE", "HALF_ULPS", "check_tolerance", "compare_output", "compare_outputs", "default_tolerance"]
