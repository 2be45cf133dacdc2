"""qnn's keep-whole and partition decisions come from one predicate, also for nodes a decomposition makes (issue 49).

ExecuTorch's backend test suite's LSTM: ``to_edge`` decomposes ``aten.lstm`` into ``aten.linear`` nodes, which qnn
keeps whole. The first step's recurrent linear multiplies the zero initial state by a weight: it reads no runtime
input, so HTP's constant-only rule refuses it at partitioning. It was kept whole anyway (it did not exist when the
keep-whole question was asked), and lowering failed: "aten.linear kept whole before decomposition, but not
delegated ... refused by filter 'htp-constant-only'".
"""

from __future__ import annotations

import pytest
import torch

import edgeplug

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch.export on nn.LSTM's flat weights


@pytest.fixture(scope="module")
def suite_lstm():
    from executorch.backends.test.suite.operators.test_lstm import Model

    torch.manual_seed(0)
    return Model(num_layers=2).eval(), ((torch.rand(1, 10, 64) * 10),)


def test_the_suites_lstm_lowers_for_qnn_with_its_constant_only_linears_decomposed(suite_lstm):
    model, args = suite_lstm
    report = edgeplug.lower(model, args, "qnn", dry_run=True).report
    assert not report.kept_whole_on_cpu
    # per layer: one input projection over the sequence and one recurrent linear per step (10), less the first step's
    assert report.delegated_ops.get("aten.linear.default") == 2 * (1 + 10) - 2
    decomposed = [c for c in report.decomposed_instead if c.op == "aten.linear.default"]
    assert len(decomposed) == 2  # each layer's first recurrent step
    assert all("constant-only" in c.reason and "htp-constant-only" in c.reason for c in decomposed)


def test_a_backend_without_the_constant_only_rule_keeps_every_linear(suite_lstm):
    """The judging on the decomposed program is the constant-only rule's; xnnpack delegates all of them as before."""
    model, args = suite_lstm
    report = edgeplug.lower(model, args, "xnnpack", dry_run=True).report
    assert not report.kept_whole_on_cpu and not report.cpu_ops.get("aten.linear.default")
