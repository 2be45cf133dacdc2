"""What a tool built on edgeplug reads of a lowering (issue 45): ``LoweringResult.edge`` stays the edge-dialect
program (to_executorch runs on a copy of its graph), and ExecuTorch's ETRecord comes through the public API."""

from __future__ import annotations

import pytest
import torch

import edgeplug


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2 + x.sum()


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("etrecord") / "small.etrecord"
    return edgeplug.lower(Small().eval(), (torch.randn(2, 8),), "xnnpack", verify=True, etrecord=path), path


def test_the_results_edge_is_the_edge_program_not_the_serialized_one(lowered):
    result, _path = lowered
    ep = result.edge.exported_program()
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    # to_executorch, run on it in place, left out variants and memory planning's allocations behind
    assert not [t for t in targets if ".out" in t or "alloc" in t], targets
    assert any("aten.sum.dim_IntList" in t for t in targets) and "executorch_call_delegate" in " ".join(targets)
    # ExecuTorch serializes it again to the same program
    assert result.edge.to_executorch().buffer == result.buffer
    assert result.report.verification.passed


def test_etrecord_is_executorchs_own_and_written_where_asked(lowered):
    from executorch.devtools import parse_etrecord
    from executorch.devtools.etrecord import ETRecord

    result, path = lowered
    assert isinstance(result.etrecord, ETRecord) and path.stat().st_size > 0
    record = parse_etrecord(str(path))
    assert record.edge_dialect_program is not None and record.exported_program is not None
    assert record.graph_map  # the delegated graph, for the Inspector's op mapping


def test_without_etrecord_none_is_made():
    result = edgeplug.lower(Small().eval(), (torch.randn(2, 8),), "xnnpack")
    assert result.etrecord is None


@pytest.mark.parametrize("etrecord", [True, "x.etrecord"])
def test_a_dry_run_has_no_etrecord_and_says_so_before_any_work(etrecord):
    with pytest.raises(edgeplug.EdgeplugError, match="a dry run compiles no delegate"):
        edgeplug.lower(Small().eval(), (torch.randn(2, 8),), "xnnpack", dry_run=True, etrecord=etrecord)


def test_etrecord_of_another_type_is_refused():
    with pytest.raises(edgeplug.EdgeplugError, match="etrecord is True or a path"):
        edgeplug.lower(Small().eval(), (torch.randn(2, 8),), "xnnpack", etrecord=3)


def test_the_command_line_writes_it(tmp_path, edgeplug_cli):
    code, _out, err = edgeplug_cli(
        "lower", "handwritten-mlp", "--backend", "xnnpack", "-o", str(tmp_path / "m.pte"),
        "--etrecord", str(tmp_path / "m.etrecord"),
    )
    assert code == 0, err
    assert (tmp_path / "m.pte").stat().st_size > 0 and (tmp_path / "m.etrecord").stat().st_size > 0


def test_executorchs_inspector_compares_the_pte_with_eager_from_edgeplugs_etrecord(lowered, tmp_path):
    """The ETRecord carries the example call as its representative inputs, so calculate_numeric_gap runs on it as
    written (ExecuTorch's Inspector, the .pte run with an ETDump and its debug buffer)."""
    from executorch.devtools import Inspector
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    result, path = lowered
    module = _load_for_executorch_from_buffer(result.buffer, enable_etdump=True, debug_buffer_size=1 << 20)
    module.forward(tuple(result.args))
    etdump, debug = tmp_path / "run.etdp", tmp_path / "run.bin"
    module.write_etdump_result_to_file(str(etdump), str(debug))
    gaps = Inspector(etdump_path=str(etdump), etrecord=str(path), debug_buffer_path=str(debug)).calculate_numeric_gap("MSE")
    assert len(gaps) >= 1 and all(g[0] < 1e-10 for g in gaps["gap"])
    assert "linear" in [op for ops in gaps["aot_ops"] for op in ops]
