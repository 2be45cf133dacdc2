"""Samsung's quantization schemes: the scheme table the plugin declares and the quantizer each scheme builds, offline.

Moved from the core's tests (issue 23): the core's part of the quantizer hook is tested in
tests/test_quantize_schemes.py on backends the test registers.
"""

from __future__ import annotations

import pytest

import edgeplug
from edgeplug._quantize.quantize import make_quantizer
from edgeplug.testing import pt2e_schemes

#: PT2E scheme -> (activation bits, weight bits, per channel); torchao source transforms are tested elsewhere
EXPECTED = {"a8w8": (8, 8, True)}


def test_the_plugin_declares_its_schemes():
    assert pt2e_schemes("samsung") == EXPECTED


@pytest.mark.parametrize("scheme", sorted(EXPECTED))
def test_factory_builds_the_backends_own_quantizer_without_the_network(scheme, edgeplug_no_network):
    from executorch.backends.samsung.quantizer import EnnQuantizer, Precision

    quantizer = make_quantizer(edgeplug.get_backend("samsung"), scheme)
    assert type(quantizer) is EnnQuantizer
    assert edgeplug_no_network == [], f"building {scheme} tried to reach the network: {edgeplug_no_network}"
    assert quantizer._precision == Precision.A8W8 and quantizer._is_per_channel
