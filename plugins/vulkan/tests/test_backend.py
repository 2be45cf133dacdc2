"""The vulkan backend: the conformance suite, and executorch's own Vulkan partitioner."""

from __future__ import annotations

import edgeplug
from edgeplug.testing.conformance import *  # noqa: F401,F403

EDGEPLUG_BACKENDS = ["vulkan"]


def test_partitions_with_executorchs_vulkan_partitioner_and_verifies_with_kernels():
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    vulkan = edgeplug.get_backend("vulkan")
    assert type(vulkan.make_partitioner()) is VulkanPartitioner
    assert vulkan.spec.backend_id == "VulkanBackend"
    assert vulkan.spec.verify_method == "kernels" and vulkan.availability().ok
    assert vulkan.fusion_policy("rms_norm").target == "et_vk.rms_norm"


class _Softplus(__import__("torch").nn.Module):
    """A linear, then log1p (no Vulkan kernel): the support check is asked why it stays."""

    def __init__(self) -> None:
        import torch

        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        import torch

        return torch.log1p(torch.relu(self.linear(x))) * 2.0


def test_executorchs_pattern_search_runs_once_per_graph_and_is_restored(monkeypatch):
    import executorch.backends.vulkan.patterns as vk_patterns
    import torch

    from edgeplug_vulkan_delegate._executorch import fusable_subgraphs_matched_once

    searched: list[int] = []
    search = vk_patterns.get_all_fusable_subgraphs

    def counting(gm):
        searched.append(id(gm))
        return search(gm)

    monkeypatch.setattr(vk_patterns, "get_all_fusable_subgraphs", counting)
    result = edgeplug.lower(_Softplus().eval(), (torch.randn(4, 16),), "vulkan")
    cpu = {c.op: c.reason for c in result.report.cpu_nodes}
    # the support check still explains the CPU node (it read the partitioner's search)
    assert cpu == {"aten.log1p.default": "Vulkan: no operator implementation"}
    assert len(searched) == len(set(searched)) >= 1  # the partitioner's graph was searched once
    assert vk_patterns.get_all_fusable_subgraphs is counting  # restored after the lowering

    class Boom(Exception):
        pass

    try:
        with fusable_subgraphs_matched_once():
            assert vk_patterns.get_all_fusable_subgraphs is not counting
            raise Boom
    except Boom:
        pass
    assert vk_patterns.get_all_fusable_subgraphs is counting  # and after an error


def test_a_changed_graph_is_searched_again():
    import executorch.backends.vulkan.patterns as vk_patterns
    import torch

    from edgeplug_vulkan_delegate._executorch import fusable_subgraphs_matched_once

    gm = torch.fx.symbolic_trace(_Softplus())
    with fusable_subgraphs_matched_once():
        first = vk_patterns.get_all_fusable_subgraphs(gm)
        assert vk_patterns.get_all_fusable_subgraphs(gm) is first
        relu = next(n for n in gm.graph.nodes if n.target is torch.relu)
        relu.replace_all_uses_with(relu.args[0])
        gm.graph.erase_node(relu)
        assert vk_patterns.get_all_fusable_subgraphs(gm) is not first
