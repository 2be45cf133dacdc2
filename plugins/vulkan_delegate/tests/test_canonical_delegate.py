"""What the Vulkan delegate's support check takes of the core's canonicalizing rewrites its backends declare.

``scalar_to_tensor`` (a scalar op becomes a tensor op on a 0-d constant) and ``any_as_amax`` (``any`` of
bools becomes a float max): the delegate refuses the op before and takes every node the rewrite leaves.
The rewrites' exactness and records are the core's tests (tests/test_canonical.py).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import edgeplug
from edgeplug._graph.ops import op_name
from edgeplug.plugin import FLOATS, apply_rewrite


def _edge(model: nn.Module, inputs: tuple):
    from executorch.exir import EdgeCompileConfig, to_edge

    ep = torch.export.export(model, inputs)
    return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()


def _calls(ep, name: str) -> list:
    return [n for n in ep.graph_module.graph.nodes if n.op == "call_function" and op_name(n) == name]


def _applied(ep, name: str, **params):
    after = copy.deepcopy(ep)
    return after, apply_rewrite(after, name, **params)


@pytest.fixture(scope="module")
def check():
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    from edgeplug_vulkan_delegate.support import support_check

    return support_check(VulkanPartitioner())


def test_the_vulkan_delegate_takes_the_tensor_form(check):
    class Scaled(nn.Module):
        def forward(self, x):
            return torch.ops.aten.sub.Scalar(torch.ops.aten.mul.Scalar(x, 0.5), 0.25)

    ep = _edge(Scaled(), (torch.randn(2, 8, 16),))
    assert not check(_calls(ep, "aten.mul.Scalar")[0])
    after, records = _applied(ep, "scalar_to_tensor", dtypes=FLOATS)
    tensors = _calls(after, "aten.mul.Tensor") + _calls(after, "aten.sub.Tensor")
    assert len(records) == len(tensors) == 2 and all(check(n) for n in tensors)


def test_any_becomes_a_float_max_the_vulkan_delegate_takes(check):
    class Any(nn.Module):
        def forward(self, x):
            return x.gt(0.5).any(-1, keepdim=True).to(torch.float32) + x

    ep = _edge(Any(), (torch.rand(2, 5, 3),))
    (any_node,) = _calls(ep, "aten.any.dim")
    assert not check(any_node)
    after, records = _applied(ep, "any_as_amax")
    assert records and not _calls(after, "aten.any.dim")
    new = [n for n in after.graph_module.graph.nodes if n.op == "call_function" and n.name not in {m.name for m in ep.graph_module.graph.nodes}]
    assert {"aten.amax.default", "aten.where.self"} <= {op_name(n) for n in new}
    assert all(check(n) for n in new)


def test_the_vulkan_delegate_backends_declare_scalar_to_tensor_and_any_as_amax():
    found = [b for b in ("vulkan", "webgpu") if b in edgeplug.backends()]
    if not found:
        pytest.skip("neither the vulkan nor the webgpu plugin is installed")
    for backend in found:
        assert {"scalar_to_tensor", "any_as_amax"} <= {p.name for p in edgeplug.get_backend(backend).passes_for("pre_partition")}
