"""What a lowering verified in executorch's runtime (the .pte run by XNNPACK) shows.

Moved from tests/test_lower.py, whose cases run on the fixture backends (host
kernels): here the runtime's own answers, a report with ``method == "pte"``,
the changed input the runtime returns, the buffer the .pte keeps between
calls, dict inputs and bf16 tolerances.
"""

from __future__ import annotations

import json

import pytest
import torch

import edgeplug
from edgeplug.examples import load_model


def test_report_is_complete_and_round_trips_through_json(edgeplug_lowering):
    report = edgeplug_lowering("mlp", "xnnpack", dry_run=False, verify=True).report
    assert (report.model, report.backend, report.distribution) == ("mlp", "xnnpack", "edgeplug-xnnpack 0.1.0")
    assert [s.stage for s in report.stages][:2] == ["export", "export passes"]
    assert all(s.seconds >= 0 for s in report.stages)
    assert report.delegated_ops == {"aten.linear.default": 2, "aten.gelu.default": 1}
    assert report.cpu_ops == {} and report.cpu_nodes == []
    assert report.verification.method == "pte" and report.verification.max_abs_diff < 1e-4
    data = json.loads(report.to_json())
    assert data["summary"]["delegated_nodes"] == 3
    again = edgeplug.LoweringReport.model_validate(data)
    assert again.model_dump() == report.model_dump()
    table = report.to_table()
    assert "aten.linear.default x2" in table and "verification (pte" in table



class _CountsCalls(torch.nn.Module):
    """Updates a buffer in forward (a step counter, a running statistic)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        self.count.add_(1.0)
        return self.lin(x) + self.count


class _ScalesItsInput(torch.nn.Module):
    """Changes its input in place."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        x.mul_(2.0)
        return self.lin(x)


@pytest.mark.parametrize("make", [_CountsCalls, _ScalesItsInput], ids=["buffer", "input"])
def test_lower_leaves_a_stateful_models_state_and_inputs_as_they_were(make):
    torch.manual_seed(0)
    model, x = make(), torch.randn(2, 4)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    given = x.clone()
    result = edgeplug.lower(model, (x,), "xnnpack", verify=True)
    v = result.report.verification
    assert v.passed, v.failures()  # eager ran on copies: the buffer's update is not counted twice
    assert all(torch.equal(state[k], t) for k, t in model.state_dict().items())
    assert torch.equal(x, given)
    labels = [o.label for o in v.outputs]
    if make is _ScalesItsInput:  # the runtime returns the changed input too: compared
        assert labels == ["input 'x' (changed in place)", "output 1"]
    else:  # the .pte keeps the buffer between calls: further calls compared too
        assert labels == ["prefill: output 0", "decode 1: output 0", "decode 2: output 0", "decode 3: output 0"]
    # verifying again gives the same answer: nothing was consumed or changed by the first run
    again = edgeplug.verify(result, "xnnpack")
    assert [o.max_abs_diff for o in again.outputs] == [o.max_abs_diff for o in v.outputs]


class _TakesADict(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x, extra):
        return self.proj(x) + extra["bias"] * extra["scale"]


def test_example_inputs_holding_a_dict_verify_in_the_runtime():
    torch.manual_seed(0)
    inputs = (torch.randn(2, 8), {"bias": torch.randn(8), "scale": torch.randn(8)})
    result = edgeplug.lower(_TakesADict(), inputs, "xnnpack", verify=True)
    assert result.report.verification.passed, result.report.verification.failures()


def test_the_default_tolerance_follows_the_output_dtype_and_the_report_says_why():
    model, inputs = load_model("mlp")[:2]
    model = model.to(torch.bfloat16)
    x = inputs[0].to(torch.bfloat16)
    report = edgeplug.lower(model, (x,), "xnnpack", verify=True).report
    check = report.verification.outputs[0]
    # bf16 kernels round differently from eager: 1e-4 would fail a correct program
    assert check.dtype == "bfloat16" and check.passed and check.max_abs_diff > 1e-4
    assert check.tolerance > check.max_abs_diff and "4 ulps at the output's magnitude" in check.tolerance_reason
    assert "tolerance" in report.to_table() and "ulps" in report.to_table()
    given = edgeplug.verify(edgeplug.lower(model, (x,), "xnnpack"), "xnnpack", tolerance=1e-6).outputs[0]
    assert given.tolerance == 1e-6 and given.tolerance_reason == "given" and not given.passed
