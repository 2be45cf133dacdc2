"""QNN's quantization schemes: the scheme table the plugin declares and the quantizer each scheme builds, offline.

Moved from the core's tests (issue 23): the core's part of the quantizer hook is tested in
tests/test_quantize_schemes.py on backends the test registers.
"""

from __future__ import annotations

import pytest

import edgeplug
from edgeplug._quantize.quantize import make_quantizer
from edgeplug.testing import pt2e_schemes

#: PT2E scheme -> (activation bits, weight bits, per channel); torchao source transforms are tested elsewhere
EXPECTED = {"8a8w": (8, 8, True), "16a8w": (16, 8, True), "8a4w": (8, 4, True), "16a4w": (16, 4, True)}


@pytest.fixture
def no_network(edgeplug_no_network, monkeypatch):
    """edgeplug_no_network, and QNN_SDK_ROOT unset."""
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    # executorch sets up the SDK once per process: make this test see the first time
    from executorch.backends.qualcomm.utils import qnn_sdk_setup

    monkeypatch.setattr(qnn_sdk_setup, "_sdk_ready", False)
    return edgeplug_no_network


def test_the_plugin_declares_its_schemes():
    assert pt2e_schemes("qnn") == EXPECTED


@pytest.mark.parametrize("scheme", sorted(EXPECTED))
def test_factory_builds_the_backends_own_quantizer_without_the_network(scheme, no_network):
    import os

    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype

    quantizer = make_quantizer(edgeplug.get_backend("qnn"), scheme)
    assert type(quantizer) is QnnQuantizer
    assert no_network == [], f"building {scheme} tried to reach the network: {no_network}"
    assert "QNN_SDK_ROOT" not in os.environ  # the variable is restored, not left empty
    config = quantizer.default_quant_config
    assert config.quant_dtype == getattr(QuantDtype, f"use_{scheme}")
    assert config.is_linear_per_channel and config.is_conv_per_channel


def test_a_qnn_sdk_root_the_user_set_is_left_alone(monkeypatch, tmp_path):
    import os

    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path))
    make_quantizer(edgeplug.get_backend("qnn"), "8a8w")
    assert os.environ["QNN_SDK_ROOT"] == str(tmp_path)
