"""Verifying programs quantized for XNNPACK: the tolerance is a few steps of the output's quantization
scale; a program quantized with another backend's quantizer is named, and its runtime failure explained
(moved from the core's tests/test_quantize_verify.py, issue 23)."""

from __future__ import annotations

import pytest

import edgeplug
from edgeplug._errors import VerificationError
from edgeplug.examples import load_model
from edgeplug._verify.quantized import QUANT_STEPS
from edgeplug._quantize.program import output_steps


def test_quantized_xnnpack_program_verifies_within_steps_of_its_output_scale():
    model, inputs, _, _ = load_model("mlp")
    quantized = edgeplug.quantize(model, inputs, "xnnpack", "8a8w")
    (step,) = output_steps(quantized)
    result = edgeplug.lower(quantized, inputs, "xnnpack", verify=True)
    (check,) = result.report.verification.outputs
    assert check.passed and check.tolerance == pytest.approx(QUANT_STEPS * step)
    assert check.tolerance_reason == f"default for a quantized output: {QUANT_STEPS} steps of its output scale {step:.4g}"
    assert 0 < check.max_abs_diff <= 2 * step  # integer arithmetic: not eager's fp32 rounding, within steps
    q = result.report.quantization
    assert q.versus_quantized == [check.max_abs_diff] and q.versus_float[0] > 0
    # edgeplug.verify on the result knows it is quantized too
    (again,) = edgeplug.verify(result, "xnnpack").outputs
    assert again.passed and again.tolerance == check.tolerance and again.max_abs_diff == check.max_abs_diff
    (given,) = edgeplug.verify(result, "xnnpack", tolerance=1e-9).outputs
    assert not given.passed and given.tolerance_reason == "given"


@pytest.mark.slow
def test_program_quantized_for_another_backend_is_named_and_its_runtime_failure_explained():
    model, inputs, _, _ = load_model("gemma-block")
    quantized = edgeplug.quantize(model, inputs, "qnn", "8a8w")
    report = edgeplug.lower(quantized, inputs, "xnnpack", dry_run=True).report
    assert report.quantization.foreign and report.quantization.quantizer_backend == "qnn"
    assert any("quantized with qnn's quantizer" in n and "not xnnpack's" in n for n in report.notes)
    # XNNPACK refuses QnnQuantizer's program at init ("Failed to define tensor 0"): a clear error, not a crash
    with pytest.raises(VerificationError, match=r"the program was quantized with qnn's quantizer .* Quantize for xnnpack itself \(its schemes: 8a8w[,)]"):
        edgeplug.lower(quantized, inputs, "xnnpack", verify=True)
