"""A quantized linear's input keeps its width through the lowering (vulkan and webgpu).

executorch's Vulkan quantized-linear pattern takes the tensor before the one
``view_copy`` in front of ``mm`` as the fused op's input, and its last size as
the input channels. The core's ``collapse_view_chains`` can make that view read
an attention output ``[1, S, H, D]`` directly: the fused op would then read D
channels instead of H*D. The lowering used to pass (the host check runs the
graph before the pattern is fused); on a device the op would compute with the
wrong width.
"""

from __future__ import annotations

import pytest
import torch

import edgeplug


class _HeadsThenLinear(torch.nn.Module):
    """An attention-style output [1, S, H, D] merged to [1, S, H*D] and projected (o_proj)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(64, 32, bias=False)

    def forward(self, x):
        return self.proj((x * 2.0).reshape(1, 8, 64))


def _linear_inputs(result) -> list[tuple[str, list[int], int]]:
    """(anchor, shape of the tensor before its input view, its width K) for each quantized mm in the delegates."""
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    from edgeplug.plugin import is_qdq, op_name

    found = []
    for _, lowered, _ in get_lowered_submodules(result.edge.exported_program().graph_module):
        for node in lowered.original_module.graph.nodes:
            if op_name(node) not in ("aten.mm.default", "aten.addmm.default", "aten.linear.default"):
                continue
            x, w = (node.args[1], node.args[2]) if op_name(node) == "aten.addmm.default" else node.args[:2]
            chain = [w, *(w.args[:1] if hasattr(w, "args") else ())]
            if not any(getattr(c, "op", "") == "call_function" and is_qdq(c.target) for c in chain):
                continue
            source = x.args[0] if op_name(x) == "aten.view_copy.default" else x
            found.append((node.name, list(source.meta["val"].shape), x.meta["val"].shape[-1]))
    return found


@pytest.mark.parametrize("backend", ["vulkan", "webgpu"])
def test_a_quantized_linear_reads_its_input_at_its_own_width(backend):
    torch.manual_seed(0)
    model, x = _HeadsThenLinear().eval(), torch.randn(1, 8, 4, 16)
    result = edgeplug.lower(edgeplug.quantize(model, (x,), backend, "w4"), (x,), backend)
    inputs = _linear_inputs(result)
    assert inputs, "no quantized linear reached the delegate"
    for anchor, shape, width in inputs:
        assert shape[-1] == width, f"{anchor}: the pattern's input is {shape}, the linear's width {width}"
    records = [t for t in result.report.transforms if t.transform == "quantized_linear_inputs_at_their_width"]
    assert records and "64 input channels, not 16" in records[0].detail


def test_a_float_linear_is_left_as_it_is():
    torch.manual_seed(0)
    model, x = _HeadsThenLinear().eval(), torch.randn(1, 8, 4, 16)
    result = edgeplug.lower(model, (x,), "vulkan")
    assert not [t for t in result.report.transforms if t.transform == "quantized_linear_inputs_at_their_width"]
