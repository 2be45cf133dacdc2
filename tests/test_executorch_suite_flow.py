"""ExecuTorch's backend test suite through edgeplug's lowering (edgeplug.testing.executorch_suite, issue 45): the
suite's own stages and runner, only the lowering stage edgeplug's."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch.backends.test.suite")


@pytest.fixture(scope="module")
def session():
    from executorch.backends.test.suite.reporting import begin_test_session, complete_test_session

    begin_test_session(None, seed=0)
    yield
    complete_test_session()


def _run(flow, model, inputs):
    from executorch.backends.test.suite.runner import run_test

    return run_test(model, inputs, flow, "case[edgeplug]", "case", 0, None, generate_random_test_inputs=False)


class AddRelu(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y)


def test_a_suite_case_runs_through_edgeplug_and_matches_eager(session):
    from executorch.backends.test.suite.reporting import TestResult

    from edgeplug.testing.executorch_suite import edgeplug_flow

    flow = edgeplug_flow("xnnpack")
    assert flow.name == "edgeplug-xnnpack" and flow.backend == "xnnpack"
    summary = _run(flow, AddRelu(), (torch.randn(2, 8), torch.randn(2, 8)))
    assert summary.result == TestResult.SUCCESS, summary.error
    # the runner's op counts come from the ETRecord edgeplug's lowering kept, and the .pte ran in ExecuTorch
    assert summary.is_delegated() and summary.delegated_op_counts and summary.pte_size_bytes


def test_a_case_edgeplug_refuses_up_front_is_skipped_saying_why(session):
    from _pytest.outcomes import Skipped

    from edgeplug.testing.executorch_suite import edgeplug_flow

    class Pool(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.adaptive_max_pool2d(x, (3, 3))

    with pytest.raises(Skipped, match="refused it up front.*adaptive_max_pool2d"):
        _run(edgeplug_flow("xnnpack"), Pool(), (torch.randn(1, 4, 8, 8),))


def test_an_unknown_backend_is_refused_naming_the_installed_ones():
    import edgeplug
    from edgeplug.testing.executorch_suite import edgeplug_flow

    with pytest.raises(edgeplug.EdgeplugError, match="xnnpack"):
        edgeplug_flow("no-such-backend")
