"""XNNPACK's PT2E quantization schemes: the scheme table the plugin declares and the quantizer each scheme builds, offline.

Moved from the core's tests (issue 23): the core's part of the quantizer hook is tested in
tests/test_quantize_schemes.py on backends the test registers.
"""

from __future__ import annotations

import pytest
import torch

import edgeplug
from edgeplug._quantize.quantize import make_quantizer
from edgeplug.testing import pt2e_schemes

#: PT2E scheme -> (activation bits, weight bits, per channel); torchao source transforms are tested elsewhere
EXPECTED = {"8a8w": (8, 8, True)}


def test_the_plugin_declares_its_schemes():
    assert pt2e_schemes("xnnpack") == EXPECTED


@pytest.mark.parametrize("scheme", sorted(EXPECTED))
def test_factory_builds_the_backends_own_quantizer_without_the_network(scheme, edgeplug_no_network):
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer

    quantizer = make_quantizer(edgeplug.get_backend("xnnpack"), scheme)
    assert type(quantizer) is XNNPACKQuantizer
    assert edgeplug_no_network == [], f"building {scheme} tried to reach the network: {edgeplug_no_network}"
    config = quantizer.global_config
    assert config.weight.qscheme == torch.per_channel_symmetric
    assert config.input_activation.dtype == torch.int8
