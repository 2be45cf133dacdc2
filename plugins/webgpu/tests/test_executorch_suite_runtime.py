"""ExecuTorch's backend test suite through webgpu, its cases run in ExecuTorch's own WebGPU runtime where one is
built here (issue 45: "vulkan and webgpu run in ExecuTorch's own runtime where it is built"), stock's ``.pte`` and
edgeplug's alike; where none is, the run stops after lowering and says why.

ExecuTorch's Python runtime does not link the Vulkan delegate WebGPU's programs carry: a delegated case that passes
here was run in the WebGPU runtime (in the Python runtime it would fail to load) and compared with eager by the
suite's own comparison.
"""

from __future__ import annotations

import pytest


from edgeplug_vulkan_delegate.runtime import WEBGPU

pytest.importorskip("executorch.backends.test.suite")


@pytest.mark.usefixtures("real_webgpu_runtime_env")
def test_suite_cases_run_in_the_webgpu_runtime_for_both_flows(runtime):
    from edgeplug.testing.executorch_suite import run_operator_tests

    run = run_operator_tests("webgpu", ["add", "relu"], first_of_each_file=True)
    assert not run.lower_only and run.runtime == runtime.name, (run.runtime, run.notes)
    assert any("stock's and edgeplug's alike" in n and runtime.name in n for n in run.notes), run.notes
    for row in run.rows:
        for side in ("stock", "edgeplug"):
            outcome = row.flows[side]
            assert outcome.outcome == "passed", (row.test, side, outcome.cases)
    # not vacuous: each test has a case delegated, run in the runtime and matching eager, in edgeplug's flow
    for row in run.rows:
        assert ("delegated", "") in row.flows["edgeplug"].cases, (row.test, row.flows["edgeplug"].cases)
    assert "run in ExecuTorch WebGPU runtime" in run.table()


def test_without_its_runtime_the_suite_stops_after_lowering_saying_why(monkeypatch):
    from edgeplug.testing.executorch_suite import run_operator_tests

    monkeypatch.setenv(WEBGPU.variable, "off")
    run = run_operator_tests("webgpu", ["add"], first_of_each_file=True, stock=False)
    assert run.lower_only and run.runtime == "", (run.runtime, run.notes)
    assert any(n.startswith("lowering only:") and f"{WEBGPU.variable}=off" in n for n in run.notes), run.notes
    (row,) = run.rows
    assert row.flows["edgeplug"].outcome == "passed" and ("lowered", "") in row.flows["edgeplug"].cases, row
    assert "lowering only" in run.table()
