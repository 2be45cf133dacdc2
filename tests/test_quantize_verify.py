"""Quantize, lower and verify every built-in LLM example under every PT2E scheme of every installed backend
(issue 10's bar): the quantized model is the reference, the norms are recomposed before annotation where
the backend has an RMSNorm fusion policy. A backend whose SDK is missing here lowers as a dry run.

How each backend's host verification reads quantized constants is tested with its plugin.
"""

from __future__ import annotations

import os

import pytest

import edgeplug
from edgeplug._quantize.quantize import schemes
from edgeplug.examples import load_model

#: norms per example (two per block, and the final one)
NORMS = {"llama": 5, "gemma-block": 3}


def _cases():
    """`make test` runs llama under the first PT2E scheme of each backend; `make zoo` (EDGEPLUG_ZOO=1)
    every scheme on both examples."""
    for backend in edgeplug.backends():
        pt2e = [s.scheme for s in schemes(edgeplug.get_backend(backend)) if s.kind == "pt2e"]
        for i, scheme in enumerate(pt2e):
            for example in sorted(NORMS):
                marks = []
                if (i > 0 or example != "llama") and os.environ.get("EDGEPLUG_ZOO") != "1":
                    marks.append(pytest.mark.skip(reason="the whole matrix runs in `make zoo` (EDGEPLUG_ZOO=1)"))
                yield pytest.param(example, backend, scheme, marks=marks, id=f"{backend}-{scheme}-{example}")


def test_the_matrix_has_a_case_per_backend_with_schemes():
    with_schemes = {b for b in edgeplug.backends() if any(s.kind == "pt2e" for s in schemes(edgeplug.get_backend(b)))}
    assert with_schemes, "no installed backend offers a PT2E scheme: the matrix below is empty"
    assert {c.values[1] for c in _cases() if not c.marks} == with_schemes


@pytest.mark.slow
@pytest.mark.parametrize("example,backend,scheme", list(_cases()))
def test_examples_quantize_lower_and_verify(example, backend, scheme):
    b = edgeplug.get_backend(backend)
    if not b.availability().dry_run:  # refused before any work on this release: tests/test_executorch_versions.py
        pytest.skip(f"backend {backend!r} cannot partition here: {b.availability().reason}")
    model, inputs, _, _ = load_model(example)
    quantized = edgeplug.quantize(model, inputs, backend, scheme)
    dry_run = not b.availability().ok
    report = edgeplug.lower(quantized, inputs, backend, verify=not dry_run, dry_run=dry_run, model_name=example).report
    q = report.quantization
    assert (q.quantizer_backend, q.scheme, q.foreign) == (backend, scheme, False)
    if b.fusion_policy("rms_norm") is not None:  # every norm recomposed before annotation
        assert len(q.norms) == NORMS[example]
        assert all(r.outcome in ("fused", "folded_weight") for r in q.norms), [r.reason for r in q.norms]
    if not dry_run:
        assert report.verification.passed, report.verification.failures()
        assert q.versus_float and q.reference == "the quantized model's eager output"
