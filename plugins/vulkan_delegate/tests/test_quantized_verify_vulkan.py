"""Verifying quantized programs on vulkan: the quantized model is the reference; host verification reads
constants as executorch's Vulkan preprocess stores them (zero points dropped, 4-bit weights packed,
batch norms folded into their convolution), and never a missing constant as zeros (moved from the
core's tests/test_quantize_verify.py, issue 23)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import edgeplug
from edgeplug._errors import VerificationError
from edgeplug.examples import load_model
from edgeplug._verify.host import run_lowered


def _delegates(result):
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    return [lowered for _, lowered, _ in get_lowered_submodules(result.edge.exported_program().graph_module)]


@pytest.fixture(scope="session")
def mlp_vulkan_w4():
    model, inputs, _, _ = load_model("mlp")
    quantized = edgeplug.quantize(model, inputs, "vulkan", "w4")
    return quantized, edgeplug.lower(quantized, inputs, "vulkan", verify=True, model_name="mlp")


def test_vulkan_weight_only_program_verifies_against_the_quantized_model(mlp_vulkan_w4):
    _, result = mlp_vulkan_w4
    report = result.report
    v = report.verification
    assert v.passed and v.max_abs_diff < 1e-5, v.failures()
    # the zero points the preprocess drops and the weights it packs were followed, not skipped
    assert "2 all-zero weight zero points implied (symmetric)" in v.note
    assert "2 4-bit weights read from their packed bytes" in v.note
    q = report.quantization
    assert q.quantizer_backend == "vulkan" and q.scheme == "w4" and not q.foreign
    assert q.reference == "the quantized model's eager output"
    # 4-bit weights: far from the float model, exact against the quantized one
    assert q.versus_quantized[0] < 1e-5 < 0.05 < q.versus_float[0]
    assert "|lowered - quantized| = " in report.to_table() and "|lowered - float| = " in report.to_table()
    assert json.loads(report.to_json())["quantization"]["versus_float"] == q.versus_float


def _pte_data(lowered):
    return lowered.named_data_store_output.pte_data


def test_a_missing_packed_weight_fails_instead_of_reading_zeros(mlp_vulkan_w4):
    from edgeplug_vulkan_delegate.preprocess import pack_int4

    _, result = mlp_vulkan_w4
    (lowered,) = _delegates(result)
    oe = lowered.original_module
    weight = oe.constants.get("_frozen_param0", oe.state_dict.get("_frozen_param0"))
    import hashlib

    from edgeplug._verify.host import _storage_bytes

    key = hashlib.sha256(_storage_bytes(pack_int4(weight).contiguous())).hexdigest()
    data = _pte_data(lowered)
    entry = data.pop(key)  # as if the .pte carried no bytes for that weight
    try:
        with pytest.raises(VerificationError, match=r"constant 'b__frozen_param0' .* is not in the delegate's named data"):
            run_lowered(result, edgeplug.get_backend("vulkan"))
    finally:
        data[key] = entry
    assert run_lowered(result, edgeplug.get_backend("vulkan")).outputs  # restored


def test_only_all_zero_zero_points_of_symmetric_weights_are_implied(mlp_vulkan_w4):
    from edgeplug._verify.host import _NamedData
    from edgeplug_vulkan_delegate.preprocess import VulkanConstants

    _, result = mlp_vulkan_w4
    (lowered,) = _delegates(result)
    rules = VulkanConstants(lowered.original_module, _NamedData(lowered))
    zeros = torch.zeros(64, dtype=torch.int64)
    assert rules.resolve("b__zero_point_0", zeros)[2] == "zero point"
    assert rules.resolve("b__zero_point_0", torch.ones(64, dtype=torch.int64)) is None  # asymmetric: must be stored
    assert rules.resolve("p_fc1_bias", torch.zeros(64)) is None  # a zero bias is data, not an implied value
    tampered = torch.zeros(64, 32, dtype=torch.int8)  # a 4-bit weight the .pte does not hold
    assert rules.resolve("b__frozen_param0", tampered) is None


def test_pack_int4_round_trips_odd_widths():
    from edgeplug_vulkan_delegate.preprocess import pack_int4, unpack_int4

    w = torch.randint(-8, 8, (5, 7), dtype=torch.int8)
    packed = pack_int4(w)
    assert packed.dtype == torch.uint8 and packed.shape == (5, 4)
    assert torch.equal(unpack_int4(packed, 7), w)


class ConvBn(nn.Module):
    """MobileNet's building block: conv + batch norm (+ depthwise conv without bias + batch norm)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8)

    def forward(self, x):
        return self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))


@pytest.fixture(scope="session")
def conv_bn_vulkan():
    g = torch.Generator().manual_seed(0)
    model = ConvBn()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        for bn in (model.b1, model.b2):
            bn.running_mean.copy_(torch.randn(8, generator=g))
            bn.running_var.copy_(torch.rand(8, generator=g) + 0.5)
    model.eval()
    x = torch.randn(1, 3, 8, 8, generator=g)
    return edgeplug.lower(model, (x,), "vulkan", verify=True)


def test_batch_norm_folded_into_its_convolution_verifies(conv_bn_vulkan):
    v = conv_bn_vulkan.report.verification
    assert v.passed and v.max_abs_diff < 1e-4, v.failures()
    assert "2 batch norms folded into their op" in v.note
    assert "4 constants read from named data" in v.note  # two folded weights, two folded biases


def test_batch_norm_fold_is_followed_only_where_the_pte_holds_the_folded_tensors(conv_bn_vulkan):
    (lowered,) = _delegates(conv_bn_vulkan)
    data = _pte_data(lowered)
    saved = dict(data)
    data.clear()  # no folded weight in the .pte: the unfolded constants are looked for, and missing
    try:
        with pytest.raises(VerificationError, match=r"constant '.*c1_weight' .* is not in the delegate's named data"):
            run_lowered(conv_bn_vulkan, edgeplug.get_backend("vulkan"))
    finally:
        data.update(saved)
