"""Vulkan's PT2E quantization schemes: the scheme table the plugin declares and the quantizer each scheme builds, offline.

Moved from the core's tests (issue 23): the core's part of the quantizer hook is tested in
tests/test_quantize_schemes.py on backends the test registers.
"""

from __future__ import annotations

import pytest

from edgeplug._quantization import make_quantizer, schemes

#: PT2E scheme -> (activation bits, weight bits, per channel); torchao source transforms are tested elsewhere
EXPECTED = {"w8": (None, 8, True), "w4": (None, 4, True)}


def test_the_plugin_declares_its_schemes():
    got = {s.scheme: (s.activation_bits, s.weight_bits, s.per_channel) for s in schemes("vulkan") if s.kind == "pt2e"}
    assert got == EXPECTED
    assert all(s.backend == "vulkan" and s.description for s in schemes("vulkan"))


@pytest.mark.parametrize("scheme", sorted(EXPECTED))
def test_factory_builds_the_backends_own_quantizer_without_the_network(scheme, edgeplug_no_network):
    from executorch.backends.vulkan.quantizer.vulkan_quantizer import VulkanQuantizer

    quantizer = make_quantizer("vulkan", scheme)
    assert type(quantizer) is VulkanQuantizer
    assert edgeplug_no_network == [], f"building {scheme} tried to reach the network: {edgeplug_no_network}"
    _, weight, _ = EXPECTED[scheme]
    config = quantizer.global_config
    assert config.input_activation is None and config.output_activation is None  # weight-only
    assert config.weight.quant_max == 2 ** (weight - 1) - 1


def test_an_unknown_scheme_names_the_weight_only_schemes_and_names_are_normalised():
    from edgeplug._quantization import QuantizationError, quant_scheme

    with pytest.raises(QuantizationError, match=r"no quantization scheme 'w3'.*w8 \(weight-only"):
        quant_scheme("vulkan", "w3")
    assert quant_scheme("vulkan", " W4 ").weight_bits == 4
