"""Comparing a lowered program's outputs with a reference, in a way a NaN cannot fool.

``compare_outputs(lowered, reference, tolerance)`` is what ``edgeplug.verify``
uses, and what any other check (a quantized reference, a device run) can call
with its own reference outputs. Per output:

- NaN and infinities are compared by position: a NaN (or +inf, -inf) where the
  reference has none, or the reverse, fails the output, with its count;
- the largest |difference| is taken over the positions where both are finite;
- the lowered dtype must be the eager one;
- integers and booleans are compared exactly, in their own dtype (never
  through float64, where ``2**53 + 1 == 2**53``);
- the tolerance is the one given (an absolute max |difference|), else a
  default by the reference's dtype: fp32/fp64 1e-4 absolute; fp16/bf16
  ``HALF_ULPS`` ulps at the output's own magnitude (its largest finite eager
  value, with no floor: an all-zero fp16 output against an eager 1e-3 is
  thousands of ulps off, and fails); the check says which it used and why.

Why the output's magnitude and not each value's: a half-precision program
rounds every intermediate at the magnitude of what it sums, so a correct
bf16 XNNPACK lowering puts a value of 0.04 in a row of values near 2 about
0.02 away from eager (67 ulps at 0.04, 3 at 2); per-value ulps would fail it.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from edgeplug._errors import EdgeplugError, VerificationError
from edgeplug._graph.ops import dtype_name
from edgeplug._report.records import OutputCheck

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


def _is_half(dtype: torch.dtype) -> bool:
    return dtype in (torch.float16, torch.bfloat16)


def ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype``'s representable numbers at each of ``values`` (float64 out).

    Zero and subnormals get the subnormal spacing; a finite value ``x`` gets
    ``eps * 2**floor(log2|x|)``.
    """
    info = torch.finfo(dtype)
    _, exponent = torch.frexp(values.to(torch.float64).abs())
    floor_log2 = (exponent - 1).to(torch.float64)
    lowest = math.log2(info.tiny)  # the smallest normal's exponent
    return info.eps * torch.exp2(torch.clamp(floor_log2, min=lowest))


def default_tolerance(reference: torch.Tensor) -> tuple[float, str]:
    """``(tolerance, why)`` for an output whose reference is ``reference``.

    fp16/bf16: ``HALF_ULPS`` ulps at the output's magnitude, its largest
    finite |eager| value (no floor: an all-zero output has a tolerance of 0).
    """
    dtype = reference.dtype
    if _is_half(dtype):
        finite = reference.detach()[torch.isfinite(reference.detach())].to(torch.float64).abs()
        if not finite.numel():
            return 0.0, f"default for {dtype_name(dtype)}: no finite value to take a magnitude from"
        top = finite.max()
        tol = 0.0 if top.item() == 0 else HALF_ULPS * ulp(top.reshape(1), dtype).item()
        return tol, (
            f"default for {dtype_name(dtype)}: {HALF_ULPS} ulps at the output's magnitude "
            f"(largest |eager| {top.item():.3g})"
        )
    if dtype.is_floating_point or dtype.is_complex:
        return FP32_TOLERANCE, f"default for {dtype_name(dtype)} outputs"
    return 0.0, f"{dtype_name(dtype)} output: must match exactly, compared in {dtype_name(dtype)}"


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


def _exact_problems(a: torch.Tensor, e: torch.Tensor) -> tuple[list[str], float]:
    """Integers and booleans: equal in their own dtype (no float64 round trip: 2**53 + 1 != 2**53)."""
    differ = a != e
    count = int(differ.sum())
    if not count:
        return [], 0.0
    where = int(differ.reshape(-1).nonzero()[0])
    got, want = a.reshape(-1)[where].item(), e.reshape(-1)[where].item()
    if a.dtype == torch.bool:
        diff = 1.0
    else:  # python ints: no overflow
        diff = float(max(abs(int(x) - int(y)) for x, y in zip(a[differ].tolist()[:4096], e[differ].tolist()[:4096])))
    problem = (
        f"{count} of {e.numel()} {dtype_name(e.dtype)} values differ (compared exactly); "
        f"first at flat index {where}: lowered {got}, eager {want}"
    )
    if e.dtype == torch.int64:
        info = torch.iinfo(torch.int32)
        wide = int(((e < info.min) | (e > info.max)).sum())
        if wide:
            problem += (
                f"; {wide} eager values lie outside int32's range, which a delegate that holds int64 as int32 "
                "cannot represent"
            )
    return [problem], diff


def compare_output(
    index: int, lowered: torch.Tensor, reference: torch.Tensor, tolerance: Optional[float] = None, name: str = ""
) -> OutputCheck:
    """One ``OutputCheck``: shape, dtype, then integers exactly, floats NaN/inf by position and within tolerance."""
    label = name or f"output {index}"
    if tuple(lowered.shape) != tuple(reference.shape):
        raise VerificationError(f"{label}: lowered shape {tuple(lowered.shape)} != eager shape {tuple(reference.shape)}")
    if tolerance is None:
        tol, why = default_tolerance(reference)
    else:
        tol, why = tolerance, "given"
    problems: list[str] = []
    if lowered.dtype != reference.dtype:
        problems.append(
            f"dtype {dtype_name(lowered.dtype)} where eager gives {dtype_name(reference.dtype)}: the program's "
            "output type differs from the model's"
        )
    a = lowered.detach().to("cpu")
    e = reference.detach().to("cpu")
    exact = not (e.dtype.is_floating_point or e.is_complex()) and not (a.dtype.is_floating_point or a.is_complex())
    if exact and tolerance is None:
        if a.dtype != e.dtype:  # compare values in the wider of the two integer types
            common = torch.promote_types(a.dtype, e.dtype)
            a, e = a.to(common), e.to(common)
        found, diff = _exact_problems(a, e)
        problems += found
        return OutputCheck(
            output=index, name=name, shape=list(reference.shape), dtype=dtype_name(reference.dtype),
            max_abs_diff=diff, tolerance=0.0, tolerance_reason=why, problems=problems,
        )
    if a.is_complex() or e.is_complex():
        a, e = torch.view_as_real(a.to(torch.complex128)), torch.view_as_real(e.to(torch.complex128))
    else:
        a, e = a.to(torch.float64), e.to(torch.float64)
    found, matched = _nonfinite_mismatches(a, e)
    problems += found
    both = torch.isfinite(a) & torch.isfinite(e)
    diff = (a[both] - e[both]).abs().max().item() if bool(both.any()) else 0.0
    if diff > tol:
        problems.append(f"max |difference| {diff:.3e} > tolerance {tol:.3e}")
    return OutputCheck(
        output=index,
        name=name,
        shape=list(reference.shape),
        dtype=dtype_name(reference.dtype),
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


__all__ = ["FP32_TOLERANCE", "HALF_ULPS", "check_tolerance", "compare_output", "compare_outputs", "default_tolerance", "ulp"]
