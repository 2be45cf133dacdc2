"""Fusion on programs quantized by executorch's own quantizers (QNN's, XNNPACK's, Samsung's) through torchao, on qnn, samsung, vulkan and webgpu (the core's part, on the fixture backends: tests/test_fusion_quantized.py).

* QnnQuantizer (8a8w) leaves each norm whole in float and its weight as
  ``dequantize(constant)``: vulkan and webgpu fold it into a float constant
  (exact: a function of constants), qnn and samsung keep it as it is;
* XNNPACKQuantizer and EnnQuantizer put quantize/dequantize inside the norm:
  the norm is refused with a reason that says what to do;
* a weight whose fold fails (the norm fused with a unit weight, the multiply kept) is the core's case
  (tests/test_fusion_quantized.py): what it reads of a policy (dequantized_weights, weight_sources,
  fold_computed_constants, unit_weight_fallback) is fixture-keep's for qnn and samsung and
  fixture-fused's for vulkan and webgpu (edgeplug_vulkan_delegate.fusion.rms_norm_policy).
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import edgeplug
from edgeplug._graph.constants import constant_value
from edgeplug._graph.ops import is_dequantize
from edgeplug._fusion.nodes import is_op

D = 16
BACKENDS = ["qnn", "samsung", "vulkan", "webgpu"]
FUSED_OP = {"aten.rms_norm": "aten::rms_norm", "et_vk.rms_norm": "et_vk::rms_norm"}


class NormLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.norm = nn.RMSNorm(D, eps=1e-6)
        self.proj = nn.Linear(D, D)
        with torch.no_grad():
            self.norm.weight.copy_(1 + 0.3 * torch.randn(D, generator=g))

    def forward(self, x):
        return self.proj(self.norm(x))


def _quantizer(name: str):
    if name == "qnn":
        os.environ["QNN_SDK_ROOT"] = ""  # unset, constructing QnnQuantizer tries to download the SDK
        from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer

        return QnnQuantizer()
    if name == "xnnpack":
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )

        return XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    from executorch.backends.samsung.quantizer.quantizer import EnnQuantizer

    return EnnQuantizer()


@pytest.fixture(scope="module")
def quantized(request):
    """(quantizer name, the quantized model, its edge program, example input)."""
    from executorch.exir import to_edge
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    x = torch.randn(1, 8, D, generator=torch.Generator().manual_seed(1))
    # a norm decomposed as models write it, so the quantizer sees pow/mean/rsqrt/mul
    model = NormLinear().eval()
    model.norm = _DecomposedNorm(model.norm)
    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), _quantizer(request.param))
    prepared(x)
    converted = convert_pt2e(prepared)
    ep = to_edge(torch.export.export(converted, (x,))).exported_program()
    return request.param, converted, ep, x


class _DecomposedNorm(nn.Module):
    def __init__(self, norm: nn.RMSNorm) -> None:
        super().__init__()
        self.weight = norm.weight

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def _fused_nodes(ep, backend):
    target = FUSED_OP[edgeplug.get_backend(backend).fusion_policy("rms_norm").target]
    return [n for n in ep.graph_module.graph.nodes if is_op(n, target)]


# QnnQuantizer leaves the norm in float, its weight dequantize(constant)
@pytest.mark.parametrize("quantized", ["qnn"], indirect=True)
@pytest.mark.parametrize("backend", BACKENDS)
def test_dequantized_weight_is_folded_or_kept_as_the_policy_says(quantized, backend):
    _, converted, ep, x = quantized
    policy = edgeplug.get_backend(backend).fusion_policy("rms_norm")
    fused_ep, records = edgeplug.fuse(ep, backend)
    (node,) = _fused_nodes(fused_ep, backend)
    weight = node.args[policy.arguments.index("weight")]
    (record,) = records
    if policy.dequantized_weights == "fold":
        # a prepacked float weight: the dequantized value, computed at AOT
        assert record.outcome == "folded_weight" and weight.op == "placeholder", record
        assert constant_value(fused_ep, weight).dtype == torch.float32
    else:
        # the backend reads the static quantized weight: dequantize(constant) stays
        assert record.outcome == "fused" and is_dequantize(weight) and weight.args[0].op == "placeholder", record
        assert constant_value(fused_ep, weight.args[0]).dtype in (torch.int8, torch.uint8)
    with torch.no_grad():
        torch.testing.assert_close(fused_ep.module()(x), converted(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("quantized", ["xnnpack", "enn"], indirect=True)
@pytest.mark.parametrize("backend", BACKENDS)
def test_norm_quantized_op_by_op_is_refused_saying_what_to_do(quantized, backend):
    _, _, ep, _ = quantized
    fused_ep, records = edgeplug.fuse(ep, backend)
    (record,) = records
    assert record.outcome == "rejected"
    assert "quantize/dequantize ops sit inside the norm" in record.reason
    assert "Quantize with edgeplug.quantize so the norm is recomposed before annotation" in record.reason
    assert not _fused_nodes(fused_ep, backend)
    assert str(fused_ep.graph_module.graph) == str(ep.graph_module.graph)
