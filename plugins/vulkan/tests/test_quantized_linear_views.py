"""A quantized linear's input and output views have the linear's own shapes through the lowering (vulkan; webgpu dequantizes such a weight on the CPU).

Inputs: executorch's Vulkan quantized-linear pattern takes the tensor before the one
``view_copy`` in front of ``mm`` as the fused op's input, and its last size as
the input channels. The core's ``collapse_view_chains`` can make that view read
an attention output ``[1, S, H, D]`` directly: the fused op would then read D
channels instead of H*D. The lowering used to pass (the host check runs the
graph before the pattern is fused); on a device the op would compute with the
wrong width.

Outputs (vulkan; webgpu runs the same pass): executorch's Vulkan quantized-linear pattern takes the one ``view_copy`` after ``mm``
as the linear's output and gives the fused op that view's shape, though the op
computes ``[*input[:-1], N]``. The core's ``collapse_view_chains`` can make that view
go straight on to the heads (``[S, N] -> [1, S, H, D]``, q/k/v of a decoder): with
xnnpack's 8da4w, ``FusePatternsPass`` then failed ("Dimension out of range") on a
program stock lowers, and with the weight-only scheme the fused op was recorded 4-d.
"""

from __future__ import annotations

from typing import Iterator

import pytest
import torch

import edgeplug

PASS = "quantized_linear_inputs_at_their_width"


class _HeadsThenLinear(torch.nn.Module):
    """An attention-style output [1, S, H, D] merged to [1, S, H*D] and projected (o_proj)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(64, 32, bias=False)

    def forward(self, x):
        return self.proj((x * 2.0).reshape(1, 8, 64))


class _LinearThenHeads(torch.nn.Module):
    """A projection split into heads and transposed (q_proj of an attention)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(64, 64, bias=False)

    def forward(self, x):
        return self.proj(x).view(1, 8, 4, 16).transpose(1, 2) * 2.0


def _quantized_mms(result) -> Iterator[tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node]]:
    """(mm, its input, the tensor before that input's one view) for each mm with a quantized weight in the delegates."""
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    from edgeplug.plugin import is_qdq, op_name

    for _, lowered, _ in get_lowered_submodules(result.edge.exported_program().graph_module):
        for node in lowered.original_module.graph.nodes:
            if op_name(node) not in ("aten.mm.default", "aten.addmm.default", "aten.linear.default"):
                continue
            x, w = (node.args[1], node.args[2]) if op_name(node) == "aten.addmm.default" else node.args[:2]
            chain = [w, *(w.args[:1] if hasattr(w, "args") else ())]
            if any(getattr(c, "op", "") == "call_function" and is_qdq(c.target) for c in chain):
                yield node, x, (x.args[0] if op_name(x) == "aten.view_copy.default" else x)


def _linear_inputs(result) -> list[tuple[str, list[int], int]]:
    """(anchor, shape of the tensor before its input view, its width K) for each quantized mm in the delegates."""
    return [(mm.name, list(source.meta["val"].shape), x.meta["val"].shape[-1]) for mm, x, source in _quantized_mms(result)]


def _output_views(result) -> list[tuple[str, list[int], list[int]]]:
    """(anchor, the op's own shape [*input[:-1], N], its one output view's shape) per quantized mm delegated."""
    found = []
    for mm, _, source in _quantized_mms(result):
        (after,) = mm.users
        found.append((mm.name, [*source.meta["val"].shape[:-1], mm.meta["val"].shape[-1]], list(after.meta["val"].shape)))
    return found


def test_a_quantized_linear_reads_its_input_at_its_own_width():
    torch.manual_seed(0)
    model, x = _HeadsThenLinear().eval(), torch.randn(1, 8, 4, 16)
    result = edgeplug.lower(edgeplug.quantize(model, (x,), "vulkan", "w4"), (x,), "vulkan")
    inputs = _linear_inputs(result)
    assert inputs, "no quantized linear reached the delegate"
    for anchor, shape, width in inputs:
        assert shape[-1] == width, f"{anchor}: the pattern's input is {shape}, the linear's width {width}"
    records = [t for t in result.report.transforms if t.transform == PASS]
    assert records and "64 input channels, not 16" in records[0].detail


def test_webgpu_dequantizes_a_weight_only_linear_on_the_cpu():
    """webgpu (same partitioner and serialization): the Vulkan serialization would fuse the int8 weight's dequantize
    and its matmul into an op ExecuTorch's WebGPU runtime lacks, so the dequantize stays on the CPU, says why, and the
    matmul is delegated with a float weight (no quantized linear reaches the delegate)."""
    if not edgeplug.get_backend("webgpu").availability().ok:
        pytest.skip("webgpu cannot serialize here")
    torch.manual_seed(0)
    model, x = _HeadsThenLinear().eval(), torch.randn(1, 8, 4, 16)
    result = edgeplug.lower(edgeplug.quantize(model, (x,), "webgpu", "w4"), (x,), "webgpu")
    assert not _linear_inputs(result)
    [dq] = [c for c in result.report.cpu_nodes if "dequantize" in c.op]
    assert "refused by filter 'webgpu_int8_matmul_weight'" in dq.reason, dq.reason
    assert result.report.delegated_ops.get("aten.mm.default") == 1, result.report.delegated_ops


def test_a_float_linear_is_left_as_it_is():
    torch.manual_seed(0)
    model, x = _HeadsThenLinear().eval(), torch.randn(1, 8, 4, 16)
    result = edgeplug.lower(model, (x,), "vulkan")
    assert not [t for t in result.report.transforms if t.transform == PASS]


@pytest.fixture(scope="module")
def model_and_input():
    torch.manual_seed(0)
    return _LinearThenHeads().eval(), torch.randn(1, 8, 64)


@pytest.mark.parametrize("backend, scheme", [("vulkan", "8da4w@xnnpack"), ("vulkan", "w4")])
def test_a_quantized_linear_output_view_has_the_linear_shape(model_and_input, backend, scheme):
    model, x = model_and_input
    name, _, owner = scheme.partition("@")
    quantized = edgeplug.quantize(model, (x,), owner or backend, name)
    result = edgeplug.lower(quantized, (x,), backend)  # 8da4w: FusePatternsPass raised IndexError here
    views = _output_views(result)
    assert views, "no quantized linear reached the delegate"
    for anchor, own, viewed in views:
        assert viewed == own, f"{anchor}: the view the pattern takes as its output is {viewed}, the op computes {own}"
    records = [t for t in result.report.transforms if t.transform == PASS and "output view" in t.detail]
    assert records and "[1, 8, 4, 16]: through [1, 8, 64] first" in records[0].detail, [t.detail for t in records]
    assert len(result.report.partitions) == 1 and not result.report.cpu_ops


def test_an_output_view_already_at_the_linear_shape_is_left_alone():
    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False)).eval(), torch.randn(1, 8, 64)
    result = edgeplug.lower(edgeplug.quantize(model, (x,), "vulkan", "w4"), (x,), "vulkan")
    assert _output_views(result)
    assert not [t for t in result.report.transforms if t.transform == PASS and "output view" in t.detail]
