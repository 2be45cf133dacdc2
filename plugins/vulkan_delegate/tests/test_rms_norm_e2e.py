"""Vulkan and WebGPU end to end: the delegate holds the core's fusions only, each with a prepacked weight.

executorch's VulkanPartitioner and vulkan_preprocess run their own RMSNorm
pattern, which folds ``1 + w``, runtime scales, graph-input gammas and
weights of shape (1,) or (4, D) into ``et_vk.rms_norm``. These tests read the
serialized delegate (the VkGraph in ``processed_bytes``), not the edge
program, because that pattern runs inside preprocess.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import edgeplug

D, EPS = 64, 1e-6


def norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


class Seed003(nn.Module):
    """The three cases of the seed report side by side, with three near-misses executorch folds."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(1 + 0.1 * torch.randn(D, generator=g))
        self.dw = nn.Parameter(0.1 * torch.randn(D, generator=g))
        self.w1 = nn.Parameter(1 + 0.1 * torch.randn(1, generator=g))
        self.w4 = nn.Parameter(1 + 0.1 * torch.randn(4, D, generator=g))

    def forward(self, x, scale, gamma, x4):
        return (
            norm(x) * self.w,  # a leaf parameter: fused as it is
            norm(x) * (1.0 + self.dw),  # Gemma: folded into a new constant
            norm(x) * (1 + scale),  # adaptive: unit weight, the multiply stays
            norm(x) * gamma,  # a graph-input gamma: unit weight, the multiply stays
            norm(x) * self.w1,  # shape (1,): not a weight; unit weight, the multiply stays
            norm(x4) * self.w4,  # shape (4, D): not a weight; unit weight, the multiply stays
        )


def inputs():
    g = torch.Generator().manual_seed(1)
    return (
        torch.randn(1, 8, D, generator=g),
        0.1 * torch.rand(1, 1, D, generator=g),
        1 + 0.1 * torch.randn(D, generator=g),
        torch.randn(2, 4, D, generator=g),
    )


def vk_graphs(edge_program):
    """(delegate, decoded VkGraph) for every Vulkan delegate of a lowered program."""
    from executorch.backends.vulkan.serialization.vulkan_graph_serialize import (
        extract_vk_flatbuffer,
        flatbuffer_to_vk_graph,
    )
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    out = []
    for _, lowered, _ in get_lowered_submodules(edge_program.graph_module):
        assert lowered.backend_id == "VulkanBackend"
        out.append((lowered, flatbuffer_to_vk_graph(extract_vk_flatbuffer(lowered.processed_bytes))))
    return out


def rms_norm_weights(edge_program):
    """For every et_vk.rms_norm in the delegates: (weight VkTensor, its bytes as float32 or None)."""
    found = []
    for lowered, graph in vk_graphs(edge_program):
        pte = dict(lowered.named_data_store_output.pte_data or {})
        buffers = lowered.named_data_store_output.buffers
        for call in graph.chain:
            if call.name != "et_vk.rms_norm.default":
                continue
            weight = graph.values[call.args[1]].value
            data = None
            if getattr(weight, "constant_id", -1) >= 0:
                key = graph.constants[weight.constant_id].named_key
                if key in pte:
                    raw = buffers[pte[key].buffer_index]
                    raw = raw if isinstance(raw, bytes) else raw.to_bytes()
                    data = torch.frombuffer(bytearray(raw[: 4 * D]), dtype=torch.float32)
            found.append((weight, data))
    return found


@pytest.fixture(scope="module", params=["vulkan", "webgpu"])
def lowered(request):
    model = Seed003().eval()
    return model, edgeplug.lower(model, inputs(), request.param, verify=True)


@pytest.mark.slow
def test_seed_003_lowers_with_only_safe_fusions(lowered):
    model, result = lowered
    outcomes = [f.outcome for f in result.report.fusions]
    assert outcomes == ["fused", "folded_weight"] + ["fused_unit_weight"] * 4
    scaled = [f.reason for f in result.report.fusions[4:]]
    assert "shape (1,), not (64,)" in scaled[0] and "shape (4, 64), not (64,)" in scaled[1]

    weights = rms_norm_weights(result.edge.exported_program())
    # exactly the six fusions the core made, none with the weight executorch's own pattern would fold in
    assert len(weights) == 6
    for tensor, data in weights:
        assert tensor.constant_id >= 0, "et_vk.rms_norm reads a weight the runtime cannot prepack"
        assert list(tensor.dims) == [D] and data is not None
    values = [d for _, d in weights]
    with torch.no_grad():
        torch.testing.assert_close(values[0], model.w.detach(), rtol=0, atol=0)
        torch.testing.assert_close(values[1], 1.0 + model.dw.detach(), rtol=0, atol=0)
    for unit in values[2:]:
        assert torch.equal(unit, torch.ones(D))
    # the runtime scale, the gamma and the two non-[D] weights are multiplied separately, inside the delegate
    muls = sum(call.name == "aten.mul.Tensor" for _, g in vk_graphs(result.edge.exported_program()) for call in g.chain)
    assert muls >= 4


@pytest.mark.slow
def test_seed_003_outputs_equal_eager(lowered):
    _, result = lowered
    v = result.report.verification
    assert v is not None and v.method == "kernels" and len(v.outputs) == 6
    assert v.max_abs_diff < 1e-4, result.report.to_table()
    assert "et_vk.rms_norm.default x6" in v.note


@pytest.mark.slow
def test_executorch_pattern_alone_would_fuse_the_refused_weight():
    """The control: without the plugin's scope, executorch fuses the (1,) weight edgeplug keeps apart."""
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    class Ones1(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1 = nn.Parameter(torch.full((1,), 1.5))

        def forward(self, x):
            return norm(x) * self.w1

    x = torch.randn(1, 8, D)
    ep = torch.export.export(Ones1(), (x,))
    plain = to_edge_transform_and_lower(ep, partitioner=[VulkanPartitioner()]).exported_program()
    # the same check that passes on edgeplug's lowering above catches it
    assert [list(w.dims) for w, _ in rms_norm_weights(plain)] == [[1]]


@pytest.mark.parametrize("backend", ["vulkan", "webgpu"])
def test_scope_restores_executorch_pattern_even_on_error(backend):
    from executorch.backends.vulkan.patterns import fusable_patterns

    entry = fusable_patterns["rms_norm"]
    scope = edgeplug.get_backend(backend).spec.lowering_context
    assert scope is not None
    with pytest.raises(RuntimeError, match="boom"):
        with scope():
            assert "rms_norm" not in fusable_patterns
            raise RuntimeError("boom")
    assert fusable_patterns["rms_norm"] is entry
    with scope():
        with scope():  # nested scopes restore once, at the outer exit
            pass
        assert "rms_norm" not in fusable_patterns
    assert fusable_patterns["rms_norm"] is entry


@pytest.mark.slow
def test_lowering_restores_executorch_pattern(lowered):
    from executorch.backends.vulkan.patterns import fusable_patterns

    assert "rms_norm" in fusable_patterns
