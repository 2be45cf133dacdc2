"""The quantizer hook's core part: scheme lookup, its errors and conflicts, on backends the test registers.

What each backend declares (its scheme table and the quantizer each scheme builds) is tested with its
plugin (plugins/<backend>/tests/test_scheme_table.py).
"""

from __future__ import annotations

import types

import pytest
import torch

import edgeplug
from edgeplug._errors import EdgeplugError
from edgeplug._quantize.quantize import QuantizationError, make_quantizer, quant_scheme, schemes

#: a quantizer factory the test can recognise: make_quantizer must call the record's factory, fresh each time
class _Quantizer:
    def __init__(self, scheme: str):
        self.scheme = scheme


def _scheme(backend: str, scheme: str, weight_bits: int, description: str = "a test scheme") -> edgeplug.QuantScheme:
    return edgeplug.QuantScheme(
        backend=backend, scheme=scheme, factory=lambda: _Quantizer(scheme), activation_bits=None,
        weight_bits=weight_bits, per_channel=True, description=description,
    )


def _plugin(name: str, *, schemes_: tuple = (), backend: bool = True) -> types.SimpleNamespace:
    hooks = {}
    if backend:
        def edgeplug_backends():
            yield edgeplug.BackendSpec(backend=name, description="a test backend", backend_id="TestBackend", partitioner=list)

        hooks["edgeplug_backends"] = edgeplug.hookimpl(edgeplug_backends)
    if schemes_:
        def edgeplug_quantizers():
            yield from schemes_

        hooks["edgeplug_quantizers"] = edgeplug.hookimpl(edgeplug_quantizers)
    return types.SimpleNamespace(**hooks)


@pytest.fixture
def quantcpu(edgeplug_register):
    """A backend 'quantcpu' with weight-only schemes w8 and w4, and a backend 'plaincpu' without a quantizer."""
    edgeplug_register(_plugin("quantcpu", schemes_=(_scheme("quantcpu", "w8", 8, "weight-only, 8 bits"),
                                                     _scheme("quantcpu", "w4", 4, "weight-only, 4 bits"))), name="quantcpu-plugin")
    edgeplug_register(_plugin("plaincpu"), name="plaincpu-plugin")


def test_schemes_are_the_records_the_plugins_yield_and_make_quantizer_calls_their_factory(quantcpu):
    assert [(s.scheme, s.weight_bits, s.backend) for s in schemes(edgeplug.get_backend("quantcpu"))] == [("w8", 8, "quantcpu"), ("w4", 4, "quantcpu")]
    a, b = make_quantizer(edgeplug.get_backend("quantcpu"), "w4"), make_quantizer(edgeplug.get_backend("quantcpu"), "w4")
    assert isinstance(a, _Quantizer) and a.scheme == "w4" and a is not b  # a fresh quantizer each call
    assert schemes(edgeplug.get_backend("plaincpu")) == []


def test_unknown_scheme_names_the_schemes_the_backend_has(quantcpu):
    with pytest.raises(QuantizationError) as err:
        quant_scheme(edgeplug.get_backend("quantcpu"), "w3")
    msg = str(err.value)
    assert "backend 'quantcpu' has no quantization scheme 'w3'" in msg
    assert "its schemes: w8, w4 (`edgeplug plugins` describes each)" in msg
    assert quant_scheme(edgeplug.get_backend("quantcpu"), " W4 ").weight_bits == 4  # names are normalised


def test_backend_without_a_quantizer_says_so_and_names_those_with_one(quantcpu):
    with pytest.raises(QuantizationError) as err:
        edgeplug.quantize(torch.nn.Linear(4, 4), (torch.ones(1, 4),), "plaincpu", "8a8w")
    msg = str(err.value)
    assert "backend 'plaincpu' has no quantizer" in msg and "edgeplug_quantizers" in msg
    assert "quantcpu" in msg.split("backends with quantizers:")[1]


def test_a_factory_that_raises_is_reported_with_the_scheme_and_backend(edgeplug_register):
    def broken():
        raise RuntimeError("needs a newer executorch")

    rec = edgeplug.QuantScheme(
        backend="brokencpu", scheme="w8", factory=broken, activation_bits=None, weight_bits=8,
        per_channel=True, description="d",
    )
    edgeplug_register(_plugin("brokencpu", schemes_=(rec,)), name="brokencpu-plugin")
    with pytest.raises(QuantizationError, match=r"scheme 'w8' for backend 'brokencpu' failed: RuntimeError: needs a newer"):
        make_quantizer(edgeplug.get_backend("brokencpu"), "w8")


def test_two_schemes_of_one_name_for_one_backend_are_a_conflict(quantcpu, edgeplug_register):
    edgeplug_register(_plugin("othercpu", schemes_=(_scheme("othercpu", "w8", 8),)), name="othercpu-plugin")
    edgeplug_register(_plugin("quantcpu", schemes_=(_scheme("quantcpu", "w8", 8, "a second w8"),), backend=False), name="w8-again")
    # the plugin manager makes the contested backend unavailable, naming both contributors
    with pytest.raises(EdgeplugError, match=r"two quantization schemes named 'w8' .*backend 'quantcpu'.*quantcpu-plugin.*w8-again"):
        make_quantizer(edgeplug.get_backend("quantcpu"), "w8")
    assert quant_scheme(edgeplug.get_backend("othercpu"), "w8").weight_bits == 8  # every other backend keeps working


def test_scheme_records_validate_their_names():
    from pydantic import ValidationError

    rec = edgeplug.QuantScheme(
        backend="X", scheme=" 8A8W ", factory=list, activation_bits=8, weight_bits=8, per_channel=True, description="d"
    )
    assert (rec.backend, rec.scheme) == ("x", "8a8w")
    with pytest.raises(ValidationError, match="scheme name '8 bit' must be lower-case"):
        edgeplug.QuantScheme(
            backend="x", scheme="8 bit", factory=list, activation_bits=8, weight_bits=8, per_channel=True, description="d"
        )
