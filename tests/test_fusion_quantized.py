"""Fusion on quantized programs, on the fixture backends (what executorch's own quantizers leave is
tested with the plugins that own those quantizers).

* a norm left whole in float with its weight ``dequantize(constant)``: a backend whose policy folds
  dequantized weights (fixture-fused) gets a float constant (exact: a function of constants), one that
  keeps them (fixture-keep) reads the quantized weight through its dequantize;
* a norm with quantize/dequantize inside it is refused with a reason that says what to do;
* whenever a norm is fused with a unit weight, the weight multiply stays.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import edgeplug
from edgeplug._graph.constants import constant_value
from edgeplug._graph.ops import is_dequantize
from edgeplug._fusion.nodes import is_op

D = 16
BACKENDS = ["fixture-keep", "fixture-fused"]
FUSED_OP = {"aten.rms_norm": "aten::rms_norm", "edgeplug_fixture.rms_norm": "edgeplug_fixture::rms_norm"}
_QD = torch.ops.quantized_decomposed
SCALE = 0.02


@pytest.fixture(scope="module", autouse=True)
def fb():
    import edgeplug_fixture_backends

    with edgeplug_fixture_backends.registered() as module:
        yield module


def _norm(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


class DequantizedWeightNorm(nn.Module):
    """A norm in float whose weight is ``dequantize(int8 constant)``, then a float linear."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        w = 1 + 0.3 * torch.randn(D, generator=g)
        self.register_buffer("qweight", torch.clamp(torch.round(w / SCALE), -128, 127).to(torch.int8))
        self.proj = nn.Linear(D, D)

    def forward(self, x):
        weight = _QD.dequantize_per_tensor.default(self.qweight, SCALE, 0, -128, 127, torch.int8)
        return self.proj(_norm(x, weight))


class QuantizedInsideNorm(nn.Module):
    """A norm whose mean square is quantized and dequantized on its way to rsqrt, as op-by-op quantizers do."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.3 * torch.randn(D, generator=torch.Generator().manual_seed(3)))

    def forward(self, x):
        ms = x.pow(2).mean(-1, keepdim=True)
        ms = _QD.dequantize_per_tensor.default(
            _QD.quantize_per_tensor.default(ms, 0.01, -128, -128, 127, torch.int8), 0.01, -128, -128, 127, torch.int8
        )
        return x * torch.rsqrt(ms + 1e-6) * self.weight


def _edge(model, x):
    from executorch.exir import EdgeCompileConfig, to_edge

    return to_edge(
        torch.export.export(model, (x,)), compile_config=EdgeCompileConfig(_check_ir_validity=False)
    ).exported_program()


def _fused_nodes(ep, backend):
    target = FUSED_OP[edgeplug.get_backend(backend).fusion_policy("rms_norm").target]
    return [n for n in ep.graph_module.graph.nodes if is_op(n, target)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_dequantized_weight_is_folded_or_kept_as_the_policy_says(backend):
    model, x = DequantizedWeightNorm().eval(), torch.randn(1, 8, D, generator=torch.Generator().manual_seed(1))
    ep = _edge(model, x)
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
        assert constant_value(fused_ep, weight.args[0]).dtype == torch.int8
    with torch.no_grad():
        torch.testing.assert_close(fused_ep.module()(x), model(x), rtol=1e-5, atol=1e-5)


def test_both_policies_are_exercised():
    policies = {edgeplug.get_backend(b).fusion_policy("rms_norm").dequantized_weights for b in BACKENDS}
    assert policies == {"fold", "keep"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_norm_quantized_op_by_op_is_refused_saying_what_to_do(backend):
    x = torch.randn(1, 8, D, generator=torch.Generator().manual_seed(1))
    ep = _edge(QuantizedInsideNorm().eval(), x)
    fused_ep, records = edgeplug.fuse(ep, backend)
    (record,) = records
    assert record.outcome == "rejected"
    assert "quantize/dequantize ops sit inside the norm" in record.reason
    assert "Quantize with edgeplug.quantize so the norm is recomposed before annotation" in record.reason
    assert not _fused_nodes(fused_ep, backend)
    assert str(fused_ep.graph_module.graph) == str(ep.graph_module.graph)


# a weight whose fold fails: a computed constant whose op cannot run at AOT here
_AOT = {"fails": False}


@torch.library.custom_op("edgeplug_test::offset_weight_core", mutates_args=())
def offset_weight(w: torch.Tensor) -> torch.Tensor:
    if _AOT["fails"]:
        raise RuntimeError("this op only runs on the device")
    return w + 1


@offset_weight.register_fake
def _(w: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(w)


class OffsetWeightNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dw = nn.Parameter(0.3 * torch.randn(D, generator=torch.Generator().manual_seed(2)))

    def forward(self, x):
        return _norm(x, offset_weight(self.dw))


@pytest.mark.parametrize("backend", BACKENDS)
def test_weight_whose_fold_fails_keeps_its_multiply(backend):
    model, x = OffsetWeightNorm().eval(), torch.randn(2, 4, D)
    ep = _edge(model, x)
    _AOT["fails"] = True
    try:
        fused_ep, records = edgeplug.fuse(ep, backend)
    finally:
        _AOT["fails"] = False
    (record,) = records
    assert record.outcome == "fused_unit_weight", record
    assert "could not be folded" in record.reason and "this op only runs on the device" in record.reason
    (node,) = _fused_nodes(fused_ep, backend)
    # the multiply by the weight reads the fused norm: dropping it would drop the weight
    (mul,) = node.users
    assert is_op(mul, "aten::mul.Tensor") and any(is_op(a, "edgeplug_test::offset_weight_core") for a in mul.args)
    with torch.no_grad():
        torch.testing.assert_close(fused_ep.module()(x), model(x), rtol=1e-5, atol=1e-5)
