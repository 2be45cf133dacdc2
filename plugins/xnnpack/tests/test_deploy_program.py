"""Dynamic programs on XNNPACK: the core's rewrites keep working where a size is symbolic.

A decoder exported with a dynamic sequence length names that length in its views (``sym_size``
nodes) and norms over rank-3 tensors; XNNPACK's partitioner takes neither, so each one used to
split a partition. Small modules here (one dynamic dim, hidden 16) lower in a second or two.
"""

from __future__ import annotations

import pytest
import torch

import edgeplug


class _NormHeads(torch.nn.Module):
    """An RMSNorm over the last dim, a split into heads by a view naming the dynamic length, an
    unsqueeze and a cat of one tensor twice (rotary tables)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(16) + 0.5)
        self.proj = torch.nn.Linear(16, 16)
        self.gate = torch.nn.Linear(16, 4)

    def forward(self, x):
        b, s, _ = x.shape
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        heads = self.proj(y).view(b, s, 4, 4).transpose(1, 2)  # (b, 4, s, 4)
        g = self.gate(y)
        # (b, 1, s, 4), as rotary tables are unsqueezed; and a table doubled as rotary embeddings are
        return heads * g.unsqueeze(1), torch.cat((g, g), -1) * 2.0


def _lower(model, x, dynamic):
    return edgeplug.lower(model, x, "xnnpack", dynamic_shapes=dynamic, verify=True)


@pytest.fixture(scope="module")
def lowered():
    torch.manual_seed(0)
    seq = torch.export.Dim("seq", min=1, max=32)
    return _NormHeads().eval(), _lower(_NormHeads().eval(), torch.randn(1, 8, 16), ({1: seq},))


def test_views_and_means_of_a_dynamic_length_are_delegated(lowered):
    model, result = lowered
    report = result.report
    assert report.verification.passed, report.verification.failures()
    # before: mean.dim (rank 3), the view naming sym_size, the unsqueeze and the cat stayed on the CPU
    assert not {"aten.mean.dim", "aten.view_copy.default", "aten.unsqueeze_copy.default", "aten.cat.default"} & set(report.cpu_ops)
    assert len(report.partitions) == 1
    done = [t.transform for t in report.transforms if t.outcome == "applied"]
    assert done.count("mean_at_rank") == 1 and done.count("symbolic_view_sizes") == 1
    assert done.count("unsqueeze_as_view") == 1 and done.count("cat_distinct_inputs") == 1


def test_the_pte_takes_other_lengths_than_the_example(lowered):
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    _, result = lowered
    program = _load_for_executorch_from_buffer(result.buffer)
    for n in (1, 5, 32):
        x = torch.randn(1, n, 16)
        with torch.no_grad():
            want = result.exported_program.module()(x)
        got = program.forward([x])
        assert len(got) == 2 and got[1].shape == (1, n, 8)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_two_symbolic_sizes_stay_as_they_were_and_are_named():
    class TwoDims(torch.nn.Module):
        def forward(self, x):
            b, s, d = x.shape
            rows = x.view(b * s, d).mean(-1, keepdim=True)  # one symbol (b*s): written -1, delegated
            return rows.view(b, s, 1) * 2.0  # two: no single -1 makes this shape

    batch, seq = torch.export.Dim("batch", min=1, max=4), torch.export.Dim("seq", min=1, max=8)
    result = _lower(TwoDims(), torch.randn(2, 3, 16), ({0: batch, 1: seq},))
    report = result.report
    assert report.verification.passed
    # the view back to (b, s, 1) cannot write both symbols as one -1: left as exported, on the CPU with XNNPACK's reason
    assert report.cpu_ops.get("aten.view_copy.default") == 1 and "aten.mean.dim" not in report.cpu_ops
    # (XNNPACK's dtype check reads the sym_size operands before its reshape check: "invalid dtype")
    assert [c.reason for c in report.cpu_nodes if c.op == "aten.view_copy.default"] == ["invalid dtype"]
