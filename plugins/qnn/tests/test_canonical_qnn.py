"""The qnn backend's dry run drops the identity copies its real flow drops, and says so in its records."""

from __future__ import annotations

import pytest
import torch

import edgeplug


@pytest.fixture(scope="module")
def llama():
    pytest.importorskip("transformers")
    import edgeplug._zoo

    _, ep, inputs, _ = edgeplug._zoo.exported("llama", 1)
    return ep, inputs


def test_the_dry_run_drops_the_copies_the_real_flow_drops_and_says_so(llama):
    if "qnn" not in edgeplug.backends():
        pytest.skip("the qnn plugin is not installed")
    ep, inputs = llama
    report = edgeplug.lower(ep, inputs, "qnn", dry_run=True).report
    assert not report.cpu_ops.get("aten.alias_copy.default") and not report.cpu_ops.get("dim_order_ops._clone_dim_order.default")
    dropped = [t for t in report.transforms if t.transform == "drop_identity_copies"]
    assert {t.op for t in dropped} >= {"aten.alias_copy.default", "dim_order_ops._clone_dim_order.default"}


class _Rms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


@pytest.mark.parametrize("stage", ["pre_partition", "edge"])
def test_qnn_fuses_its_aten_rms_norm_before_any_rewrite_whatever_its_stage(edgeplug_register, stage):
    """qnn's target is aten.rms_norm, fused on the aten program: even an edge-stage rewrite asked to run
    before the fusion finds the mean already inside the norm (the core tests the same on fixture-keep)."""
    from edgeplug.plugin import rewrite_pass

    class MeanAtRank:
        @edgeplug.hookimpl
        def edgeplug_passes(self):
            yield rewrite_pass("mean_at_rank", backend="qnn", stage=stage, rank=4, dims=(2, 3))

    edgeplug_register(MeanAtRank(), name=f"mean-at-rank-qnn-{stage}")
    report = edgeplug.lower(_Rms(), (torch.randn(1, 2, 8),), "qnn", dry_run=True).report
    [fusion] = report.fusions
    assert fusion.outcome == "fused" and not [t for t in report.transforms if t.transform == "mean_at_rank"]
