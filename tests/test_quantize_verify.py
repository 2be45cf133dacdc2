"""Verifying quantized programs: the quantized model is the reference; host verification reads
constants as executorch's Vulkan preprocess stores them (zero points dropped, 4-bit weights packed,
batch norms folded into their convolution), and never a missing constant as zeros."""

from __future__ import annotations

import os

import json

import pytest
import torch
from torch import nn

import edgeplug
from edgeplug._errors import VerificationError
from edgeplug.examples import load_model
from edgeplug._verify.quantized import QUANT_STEPS
from edgeplug._quantized import output_steps
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
            run_lowered(result, "vulkan")
    finally:
        data[key] = entry
    assert run_lowered(result, "vulkan").outputs  # restored


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
            run_lowered(conv_bn_vulkan, "vulkan")
    finally:
        data.update(saved)


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


ALL_SCHEMES = [
    ("xnnpack", "8a8w"), ("vulkan", "w8"), ("vulkan", "w4"), ("webgpu", "w8"), ("webgpu", "w4"),
    ("qnn", "8a8w"), ("qnn", "16a8w"), ("qnn", "8a4w"), ("samsung", "a8w8"),
]


#: `make test` runs llama under one scheme per backend (both weight widths across vulkan and
#: webgpu, QNN's 16-bit activations) and gemma-block (its `1 + w` norms) under XNNPACK's;
#: `make zoo` (EDGEPLUG_ZOO=1) runs every scheme for both.
IN_MAKE_TEST = {
    "llama": {("xnnpack", "8a8w"), ("vulkan", "w4"), ("webgpu", "w8"), ("qnn", "16a8w"), ("samsung", "a8w8")},
    "gemma-block": {("xnnpack", "8a8w")},
}


def _example_cases():
    for backend, scheme in ALL_SCHEMES:
        for example in ("llama", "gemma-block"):
            marks = []
            if (backend, scheme) not in IN_MAKE_TEST[example] and os.environ.get("EDGEPLUG_ZOO") != "1":
                marks.append(pytest.mark.skip(reason="the whole matrix runs in `make zoo` (EDGEPLUG_ZOO=1)"))
            yield pytest.param(example, backend, scheme, marks=marks, id=f"{backend}-{scheme}-{example}")


@pytest.mark.slow
@pytest.mark.parametrize("example,backend,scheme", list(_example_cases()))
def test_examples_quantize_lower_and_verify(example, backend, scheme):
    """Issue 10's bar: every scheme of every backend; qnn and samsung (no SDK here) as dry runs."""
    model, inputs, _, _ = load_model(example)
    quantized = edgeplug.quantize(model, inputs, backend, scheme)
    dry_run = backend in ("qnn", "samsung")
    report = edgeplug.lower(quantized, inputs, backend, verify=not dry_run, dry_run=dry_run, model_name=example).report
    q = report.quantization
    assert (q.quantizer_backend, q.scheme, q.foreign) == (backend, scheme, False)
    if backend != "xnnpack":  # every norm recomposed before annotation (xnnpack has no fusion policy)
        assert len(q.norms) == {"llama": 5, "gemma-block": 3}[example]
        assert all(r.outcome in ("fused", "folded_weight") for r in q.norms)
    if not dry_run:
        assert report.verification.passed, report.verification.failures()
        assert q.versus_float and q.reference == "the quantized model's eager output"


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
