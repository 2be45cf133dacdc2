"""The core's test backends (tests/fixtures/backends) are real backends.

The core's tests lower to them instead of a first-party plugin, so each must
do for real what it claims: its partitioner tags, its preprocess serializes
a delegate the .pte carries (with every constant in the delegate's named
data), its fused op passes ExecuTorch's verifier and runs on its host kernel,
its filter refuses with its reason, and the offline one refuses to serialize.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import edgeplug

D = 16


class NormThenLinear(torch.nn.Module):
    """An RMSNorm written out (as models do), its weight a parameter, then a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.weight = torch.nn.Parameter(torch.rand(D) + 0.5)
        self.proj = torch.nn.Linear(D, D)

    def forward(self, x):
        norm = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return self.proj(norm) / 2


def _inputs():
    return (torch.randn(2, 3, D),)


def _delegated_ops(result) -> Counter:
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    from edgeplug.plugin import op_name

    gm = result.edge.exported_program().graph_module
    return Counter(
        op_name(n.target)
        for _, lowered, _ in get_lowered_submodules(gm)
        for n in lowered.original_module.graph.nodes
        if n.op == "call_function"
    )


def _pte_delegates(result) -> set[str]:
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(result.buffer).program
    return {d.id for plan in program.execution_plan for d in plan.delegates}


def test_keep_fuses_into_aten_rms_norm_inside_its_serialized_delegate(fixture_backends):
    fb = fixture_backends
    result = edgeplug.lower(NormThenLinear().eval(), _inputs(), fb.KEEP)
    assert not result.report.dry_run
    assert [f.outcome for f in result.report.fusions] == ["fused"], result.report.to_table()
    assert _delegated_ops(result)["aten.rms_norm.default"] == 1
    assert _pte_delegates(result) == {fb.BACKEND_IDS[fb.KEEP]}


def test_fused_op_is_delegated_and_verified_on_its_host_kernel(fixture_backends):
    fb = fixture_backends
    result = edgeplug.lower(NormThenLinear().eval(), _inputs(), fb.FUSED, verify=True)
    assert _delegated_ops(result)[f"{fb.FUSED_OP}.default"] == 1
    check = result.report.verification
    assert check is not None and check.method == "kernels" and check.passed, result.report.to_table()
    # the fused op ran on the plugin's kernel, not as torch's reference, on weights read back from the .pte
    assert f"kernels ran {fb.FUSED_OP}.default x1 on the adapter" in check.note, check.note
    assert "constants read from named data" in check.note, check.note


def test_fused_kernel_refuses_a_weight_of_the_wrong_shape(fixture_backends):
    fb = fixture_backends
    from edgeplug.plugin import OpCall

    call = OpCall(backend=fb.FUSED, op=f"{fb.FUSED_OP}.default", node="n", args=(torch.ones(2, D), torch.ones(D + 1), 1e-6), kwargs={})
    with pytest.raises(edgeplug.KernelError, match=rf"weight of shape \({D + 1},\).*last size is {D}"):
        fb.check_rms_norm(call)


def test_table_runs_its_pass_and_its_filter_refuses_float64_with_its_reason(fixture_backends):
    fb = fixture_backends
    result = edgeplug.lower(NormThenLinear().double().eval(), (torch.randn(2, 3, D, dtype=torch.float64),), fb.TABLE)
    report = result.report
    assert report.fusions == [] and not _delegated_ops(result)
    assert any(fb.NO_FLOAT64_REASON in line for line in report.to_table().splitlines()), report.to_table()
    # the export-stage pass replaced the division by two
    float32 = edgeplug.lower(NormThenLinear().eval(), _inputs(), fb.TABLE)
    assert "aten.div.Tensor" not in _delegated_ops(float32) and not float32.report.cpu_ops


def test_offline_refuses_to_serialize_and_dry_runs_on_request(fixture_backends):
    fb = fixture_backends
    with pytest.raises(edgeplug.BackendUnavailableError, match="the fixture SDK is not installed"):
        edgeplug.lower(NormThenLinear().eval(), _inputs(), fb.OFFLINE)
    result = edgeplug.lower(NormThenLinear().eval(), _inputs(), fb.OFFLINE, dry_run=True)
    assert result.report.dry_run


def test_stock_lowers_with_executorchs_own_partitioner_and_has_a_stock_flow(fixture_backends):
    from edgeplug._stock import stock_partitioning

    fb = fixture_backends
    result = edgeplug.lower(NormThenLinear().eval(), _inputs(), fb.STOCK)
    assert _pte_delegates(result) == {"BackendWithCompilerDemo"}
    stock = stock_partitioning(NormThenLinear().eval(), _inputs(), edgeplug.get_backend(fb.STOCK))
    assert not stock.error and stock.partitions, stock


def test_fixture_backends_are_registered_only_where_a_test_asks_for_them():
    assert not [b for b in edgeplug.backends() if b.startswith("fixture-")]
