"""The Vulkan delegate family's quantization schemes (``records.weight_only_schemes``, which vulkan and webgpu
both declare): the scheme table each backend declares and the quantizer each scheme builds, offline.

Was plugins/vulkan/tests/test_scheme_table.py and plugins/webgpu/tests/test_scheme_table.py, line for line
the same but for the backend's name. The core's part of the quantizer hook is tested in
tests/test_quantize_schemes.py on backends the test registers.
"""

from __future__ import annotations

import pytest

import edgeplug
from edgeplug._quantize.quantize import make_quantizer
from edgeplug.testing import pt2e_schemes

BACKENDS = ["vulkan", "webgpu"]
#: PT2E scheme -> (activation bits, weight bits, per channel): weight-only
EXPECTED = {"w8": (None, 8, True), "w4": (None, 4, True)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_plugin_declares_its_schemes(backend):
    assert pt2e_schemes(backend) == EXPECTED


@pytest.mark.parametrize("scheme", sorted(EXPECTED))
@pytest.mark.parametrize("backend", BACKENDS)
def test_factory_builds_vulkans_weight_only_quantizer_without_the_network(backend, scheme, edgeplug_no_network):
    from executorch.backends.vulkan.quantizer.vulkan_quantizer import VulkanQuantizer

    quantizer = make_quantizer(edgeplug.get_backend(backend), scheme)
    assert type(quantizer) is VulkanQuantizer and edgeplug_no_network == []
    config = quantizer.global_config
    assert config.input_activation is None and config.output_activation is None
    assert config.weight.quant_max == 2 ** (EXPECTED[scheme][1] - 1) - 1


def test_an_unknown_scheme_names_the_weight_only_schemes_and_names_are_normalised():
    from edgeplug._quantize.quantize import QuantizationError, quant_scheme

    with pytest.raises(QuantizationError, match=r"no quantization scheme 'w3'; its schemes: w8, w4, w4-g32 "):
        quant_scheme(edgeplug.get_backend("vulkan"), "w3")
    assert quant_scheme(edgeplug.get_backend("vulkan"), " W4 ").weight_bits == 4
