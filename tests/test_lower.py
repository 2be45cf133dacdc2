"""The Python API: edgeplug.lower / transform / fuse and what a LoweringResult offers."""

from __future__ import annotations

import json

import pytest
import torch

import edgeplug
from edgeplug.errors import EdgeplugError, PassError
from edgeplug.examples import load_model


@pytest.fixture(autouse=True)
def _clean(clean_plugin_env):
    edgeplug.plugins.reset()


@pytest.fixture(scope="module")
def mlp():
    model, inputs, _ = load_model("mlp")
    return model, inputs


def _delegate_ids(pte: bytes) -> set[str]:
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte).program
    return {d.id for plan in program.execution_plan for d in plan.delegates}


def test_lowering_result_saves_atomically_and_reports_it(edgeplug_lowering, tmp_path):
    result = edgeplug_lowering("mlp", "xnnpack", dry_run=False)
    assert _delegate_ids(result.buffer) == {"XnnpackBackend"}
    assert result.program is not None
    target = tmp_path / "nested" / "dir" / "mlp.pte"
    assert result.save(target) == target
    assert target.read_bytes() == result.buffer
    assert result.report.output_path == str(target)
    assert result.report.output_bytes == len(result.buffer)
    target.write_bytes(b"stale")
    result.save(target)  # replaces an existing file whole
    assert target.read_bytes() == result.buffer
    assert [p.name for p in target.parent.iterdir()] == ["mlp.pte"]  # no temporary left behind


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


def test_dry_run_result_has_no_program_to_save(edgeplug_lowering, tmp_path):
    result = edgeplug_lowering("mlp", "qnn")  # QNN cannot serialize here: a dry run
    assert result.report.dry_run and result.program is None
    assert result.report.partitions and result.report.delegated_nodes > 0
    with pytest.raises(EdgeplugError, match="this was a dry run: there is no .pte to write"):
        result.save(tmp_path / "qnn.pte")
    assert list(tmp_path.iterdir()) == []


def test_lower_accepts_an_exported_program_and_notes_skipped_verification(mlp):
    model, inputs = mlp
    ep = torch.export.export(model, inputs)
    result = edgeplug.lower(ep, inputs, "xnnpack", dry_run=True, verify=True)
    assert result.report.model == "ExportedProgram"
    assert result.report.delegated_nodes == 3
    assert result.report.verification is None
    assert "verification skipped: a dry run produces no program to run" in result.report.notes
    assert "export" not in [s.stage for s in result.report.stages]  # already exported


class _ReluToAbs:
    """Registers an export-stage pass on xnnpack that rewrites relu into abs."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def rewrite(self, ep):
        if self.fail:
            raise ValueError("cannot find the attention block")
        for node in ep.graph.nodes:
            if node.target is torch.ops.aten.relu.default:
                node.target = torch.ops.aten.abs.default
        ep.graph_module.recompile()
        return ep

    @edgeplug.hookimpl
    def edgeplug_passes(self):
        yield edgeplug.PassSpec(backend="xnnpack", stage="export", name="relu-to-abs", fn=self.rewrite)


class _Relu(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1


def test_transform_runs_the_backends_export_passes(edgeplug_register):
    edgeplug_register(_ReluToAbs(), name="relu-to-abs-plugin")
    x = torch.tensor([[-2.0, 3.0]])
    ep = torch.export.export(_Relu(), (x,))
    out = edgeplug.transform(ep, "xnnpack")
    targets = {n.target for n in out.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.abs.default in targets and torch.ops.aten.relu.default not in targets
    assert torch.equal(out.module()(x), torch.tensor([[3.0, 4.0]]))
    # another backend does not get xnnpack's pass
    vulkan_out = edgeplug.transform(torch.export.export(_Relu(), (x,)), "vulkan")
    assert torch.ops.aten.relu.default in {n.target for n in vulkan_out.graph.nodes}


def test_a_failing_pass_is_named_with_its_plugin(edgeplug_register):
    edgeplug_register(_ReluToAbs(fail=True), name="relu-to-abs-plugin")
    x = torch.tensor([[-2.0, 3.0]])
    with pytest.raises(PassError) as err:
        edgeplug.lower(_Relu(), (x,), "xnnpack", dry_run=True)
    msg = str(err.value)
    assert "pass 'relu-to-abs' of backend 'xnnpack'" in msg
    assert "relu-to-abs-plugin" in msg
    assert "ValueError: cannot find the attention block" in msg


def test_fuse_returns_a_program_computing_the_same(llama_edge, llama_example):
    from copy import deepcopy

    _, inputs = llama_example
    ep = deepcopy(llama_edge)
    fused, records = edgeplug.fuse(ep, "vulkan")
    assert isinstance(fused, torch.export.ExportedProgram)
    assert all(isinstance(r, edgeplug.FusionRecord) for r in records)
    for r in records:
        assert r.outcome != "rejected" or r.reason, f"a rejected fusion must say why: {r}"
    expected = llama_edge.module()(*inputs)
    torch.testing.assert_close(fused.module()(*inputs), expected, atol=1e-5, rtol=1e-5)


def test_every_public_name_stays_the_function_whatever_was_imported_first():
    # the pipeline lives in edgeplug.pipeline, so importing it (or using any
    # other public name first) can never rebind edgeplug.lower to a module
    import subprocess
    import sys

    code = (
        "import edgeplug, edgeplug.pipeline, edgeplug.report\n"
        "names = ['transform', 'fuse', 'verify', 'lower', 'backends', 'get_backend']\n"
        "for n in names: getattr(edgeplug, n)\n"
        "import edgeplug.pipeline\n"
        "assert all(callable(getattr(edgeplug, n)) and not isinstance(getattr(edgeplug, n), type(edgeplug)) for n in names)\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
