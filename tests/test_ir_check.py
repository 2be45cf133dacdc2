"""edgeplug's strict IR check as a policy (issue 49): the model's own ops outside core ATen go through it as
stock's flow lets them through; one left on the CPU without an ExecuTorch kernel is refused up front, naming the
op; the check still refuses what a transform created (tests/test_real_path.py)."""

from __future__ import annotations

import pytest
import torch

import edgeplug
from edgeplug._graph.ir_check import NoCpuKernelError, out_variant, portable_kernels


class VarMean(torch.nn.Module):
    """``aten.var_mean.correction``: not core ATen, no decomposition, and ExecuTorch's portable kernels have it."""

    def forward(self, x):
        var, mean = torch.var_mean(x, dim=1, correction=0)
        return var + mean


class AdaptiveMaxPool(torch.nn.Module):
    """``aten.adaptive_max_pool2d``: not core ATen, no decomposition, no portable kernel; Core ML delegates it."""

    def forward(self, x):
        return torch.nn.functional.adaptive_max_pool2d(x, (3, 3))


class RoundDecimals(torch.nn.Module):
    def forward(self, x):
        return torch.round(x, decimals=2) + 1


def test_a_non_core_op_with_a_cpu_kernel_lowers_and_runs():
    """Before: 'SpecViolationError ... not in Core ATen opset', blamed on ExecuTorch. Stock's flow lowers it."""
    result = edgeplug.lower(VarMean(), (torch.randn(4, 8),), "xnnpack", verify=True)
    assert result.report.cpu_ops == {"aten.var_mean.correction": 1}
    assert result.report.verification.passed
    assert len(result.buffer) > 0


def test_a_non_core_op_the_backend_takes_is_delegated():
    """Core ML takes adaptive_max_pool2d, as stock's Core ML flow delegates it; edgeplug refused the program."""
    report = edgeplug.lower(AdaptiveMaxPool(), (torch.randn(1, 4, 8, 8),), "coreml", dry_run=True).report
    assert report.delegated_ops == {"aten.adaptive_max_pool2d.default": 1} and not report.cpu_ops


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_non_core_op_left_on_the_cpu_without_a_kernel_is_refused_up_front(dry_run, tmp_path):
    with pytest.raises(NoCpuKernelError) as info:
        edgeplug.lower(AdaptiveMaxPool(), (torch.randn(1, 4, 8, 8),), "xnnpack", dry_run=dry_run)
    msg = str(info.value)
    assert "aten.adaptive_max_pool2d.default" in msg and "portable kernels have no adaptive_max_pool2d.out" in msg
    assert "XnnpackPartitioner" in msg  # why the backend did not take it
    assert "Missing operator" in msg and "nothing was written" in msg
    assert "executorch's own" not in msg and "SpecViolationError" not in msg
    assert info.value.at_fault == "the model"


def test_the_kernel_is_looked_up_by_the_ops_own_out_variant():
    """round.default has a portable kernel, round.decimals does not: the overload decides, not the op's name."""
    assert "round.out" in portable_kernels() and out_variant(torch.ops.aten.round.default) == "round.out"
    assert out_variant(torch.ops.aten.round.decimals) == "round.decimals_out"
    with pytest.raises(NoCpuKernelError, match=r"aten\.round\.decimals.*round\.decimals_out"):
        edgeplug.lower(RoundDecimals(), (torch.randn(4, 4),), "xnnpack", dry_run=True)


def test_a_refusal_of_the_check_itself_is_edgeplugs_never_executorchs():
    """Where ExecuTorch's verifier refuses an op no transform is known to have made, the error names edgeplug's
    check (edgeplug chose to run it), not ExecuTorch. The refusal here is ExecuTorch's real one."""
    from executorch.exir import EdgeCompileConfig, to_edge

    from edgeplug._failures import stage_failure

    ep = torch.export.export(AdaptiveMaxPool(), (torch.randn(1, 4, 8, 8),))
    with pytest.raises(Exception) as info:
        to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=True))
    err = stage_failure(info.value, "to_edge", edgeplug.get_backend("xnnpack"))
    msg = str(err)
    assert err.at_fault == "edgeplug's strict IR check"
    assert "SpecViolationError" in msg and "aten.adaptive_max_pool2d" in msg
    assert "edgeplug's strict IR check" in msg and "report it to edgeplug" in msg
    assert "executorch's own" not in msg and "report it to ExecuTorch" not in msg


class AdaptiveMaxPool1d(torch.nn.Module):
    """``to_edge`` decomposes ``aten.adaptive_max_pool1d`` into ``aten.adaptive_max_pool2d``, not core ATen either."""

    def forward(self, x):
        return torch.nn.functional.adaptive_max_pool1d(x, 3)


def test_an_op_a_decomposition_of_the_models_own_makes_goes_through_too():
    """Before: 'SpecViolationError: ... adaptive_max_pool2d is not in Core ATen opset', a lowering failure."""
    with pytest.raises(NoCpuKernelError, match=r"aten\.adaptive_max_pool2d\.default"):
        edgeplug.lower(AdaptiveMaxPool1d(), (torch.randn(1, 4, 8),), "xnnpack", dry_run=True)
    report = edgeplug.lower(AdaptiveMaxPool1d(), (torch.randn(1, 4, 8),), "coreml", dry_run=True).report
    assert report.delegated_ops and not report.cpu_ops


def test_an_op_the_decomposition_makes_of_a_program_exported_with_grad_on_goes_through_too():
    """ExecuTorch's suite exports with grad on: the program holds aten.embedding_bag, which to_edge (no grad)
    makes aten._embedding_bag_forward_only. Before: edgeplug's strict IR check refused it."""
    model = torch.nn.EmbeddingBag(10, 5, mode="mean")
    args = (torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 4]))
    ep = torch.export.export(model, args)
    with pytest.raises(NoCpuKernelError, match=r"aten\._embedding_bag_forward_only\.default"):
        edgeplug.lower(ep, args, "xnnpack", dry_run=True)
