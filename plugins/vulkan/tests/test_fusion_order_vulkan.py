"""vulkan fuses RMSNorm into its own op (et_vk.rms_norm) on the edge program: a rewrite runs after that
fusion by default, and an edge-stage rewrite asked to run before it changes what the matcher sees."""

from __future__ import annotations

import pytest
import torch

import edgeplug
from edgeplug.plugin import rewrite_pass


class _Rms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


@pytest.mark.parametrize("stage, fused", [("pre_partition", True), ("edge", False)])
def test_rewrites_run_after_the_vulkan_fusion_unless_asked_to_run_before(edgeplug_register, stage, fused):
    class MeanAtRank:
        @edgeplug.hookimpl
        def edgeplug_passes(self):
            yield rewrite_pass("mean_at_rank", backend="vulkan", stage=stage, rank=4, dims=(2, 3))

    edgeplug_register(MeanAtRank(), name=f"mean-at-rank-vulkan-{stage}")
    report = edgeplug.lower(_Rms(), (torch.randn(1, 2, 8),), "vulkan", dry_run=True).report
    rewritten = [t for t in report.transforms if t.transform == "mean_at_rank"]
    if fused:
        [fusion] = report.fusions
        assert fusion.outcome == "fused" and not rewritten
    else:
        assert not any(f.outcome == "fused" for f in report.fusions)
        assert [t.outcome for t in rewritten] == ["applied"]
