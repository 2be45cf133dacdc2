"""Fault injection on vulkan: a corrupted weight fails --verify; executorch's own failures (a pass its pass
manager reports, the LFM2 partition stock executorch fails on) are named as executorch's, with the stage.

Moved from the core's tests/test_faults.py (issue 23).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import edgeplug


@pytest.fixture
def cli(capsys):
    """Run ``edgeplug ARGS...`` in this process: returns (exit code, stdout, stderr)."""
    from edgeplug._cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse usage errors
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture(autouse=True)
def _clean(monkeypatch, tmp_path):
    for var in ("EDGEPLUG_PLUGINS", "EDGEPLUG_DISABLE_PLUGINS", "EDGEPLUG_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _no_traceback(stderr: str) -> None:
    assert "Traceback (most recent call last)" not in stderr, stderr


def _first_line(stderr: str) -> str:
    lines = [l for l in stderr.splitlines() if l.startswith("edgeplug: error:")]
    assert len(lines) == 1, stderr
    return lines[0]


class CorruptWeight:
    """An export-stage pass on ``backends`` that corrupts fc1's weight of the mlp example."""

    def __init__(self, backends: tuple[str, ...], how: str) -> None:
        self.backends, self.how = backends, how

    def corrupt(self, ep):
        key = next(k for k in ep.state_dict if k.endswith("fc1.weight"))
        w = ep.state_dict[key].detach().clone()
        if self.how == "nan":
            w[0, 0] = float("nan")
        else:
            w = w * 1.01
        # in place, as a careless pass would: a program that shares the caller's tensors passes it on
        ep.state_dict[key].data.copy_(w) if self.how == "inplace" else ep.state_dict.__setitem__(key, torch.nn.Parameter(w, requires_grad=False))
        return ep

    @edgeplug.hookimpl
    def edgeplug_passes(self):
        for b in self.backends:
            yield edgeplug.PassSpec(backend=b, stage="export", name=f"corrupt-{self.how}", fn=self.corrupt)


@pytest.mark.parametrize("how", ["nan", "scale"])
def test_verify_fails_on_a_corrupted_weight(cli, edgeplug_register, tmp_path, how):
    backend = "vulkan"
    edgeplug_register(CorruptWeight((backend,), how), name="corrupter")
    out, rep = tmp_path / "m.pte", tmp_path / "m.json"
    code, stdout, stderr = cli("lower", "mlp", "-b", backend, "--verify", "-o", out, "--report", rep, "-q")
    assert code == 3, stderr
    first = _first_line(stderr)
    assert first.startswith("edgeplug: error: verification failed: output 0: ")
    if how == "nan":
        assert "NaN where eager has none" in first
    else:
        assert "max |difference|" in first and "> tolerance 1.000e-04" in first
    assert first.endswith("no .pte was written")
    assert not out.exists() and _files(tmp_path) == ["m.json"]
    # the report is strict JSON and says why
    data = json.loads(rep.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c} in the report"))
    assert data["summary"]["verified"] is False and data["output_path"] is None
    assert data["verification"]["outputs"][0]["problems"]
    _no_traceback(stderr)


class _ConvBn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x))


def test_a_pass_executorchs_pass_manager_reports_is_named_as_executorchs():
    from executorch.backends.xnnpack._passes import FuseBatchNormPass
    from executorch.exir import EdgeCompileConfig, to_edge
    from executorch.exir.pass_manager import ExportedProgramPassManager

    from edgeplug._failures import stage_failure

    ep = torch.export.export(_ConvBn().eval(), (torch.randn(1, 3, 8, 8),))
    edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    with pytest.raises(Exception) as info:  # the pass has no program to read the conv's weights from
        ExportedProgramPassManager([FuseBatchNormPass(None)])(edge)
    err = stage_failure(info.value, "partition + delegate", edgeplug.get_backend("vulkan"))
    text = str(err)
    assert text.startswith("stage 'partition + delegate' failed for backend 'vulkan' in executorch's pass FuseBatchNormPass: AttributeError: ")
    assert "This error is executorch's own, not edgeplug's or a plugin's" in text
    assert "An error occurred when running" not in text  # the wrapper's words are not the cause


def _tiny_lfm2():
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    torch.manual_seed(0)
    args = ModelArgs(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, vocab_size=128, hidden_dim=128, max_seq_len=32,
        max_context_len=32, max_batch_size=1, norm_eps=1e-5, layer_types=["conv", "full_attention"],
    )
    return construct_transformer(args).eval(), (torch.randint(0, 128, (1, 8)),)


@pytest.mark.slow
def test_lfm2_on_vulkan_lowers_and_verifies_where_stock_executorch_fails(cli, tmp_path):
    # stock to_edge_transform_and_lower with VulkanPartitioner fails on this model inside
    # executorch ("SpecViolationError: Buffer output ... does not point to a buffer that
    # exists": the safe softmax's any.dim split the graph, a partition returned a buffer
    # mutation); with the delegate's any_as_amax rewrite it is one partition
    (tmp_path / "lfm2.py").write_text(
        "import sys\nsys.path.insert(0, %r)\nfrom test_faults_vulkan import _tiny_lfm2 as make\n" % str(Path(__file__).parent)
    )
    out = tmp_path / "lfm2.pte"
    code, stdout, stderr = cli("lower", f"{tmp_path / 'lfm2.py'}:make", "-b", "vulkan", "--verify", "-o", out, "-q")
    assert code == 0, stderr
    assert out.exists() and out.stat().st_size > 0


def test_an_executorch_failure_names_executorch_and_the_stage_it_happens_in():
    # the same model without the any_as_amax rewrite fails as stock does: the error is
    # executorch's, in partitioning (not 'to_edge', the stage executorch's call belongs to)
    import dataclasses

    from edgeplug._errors import LoweringError

    vulkan = edgeplug.get_backend("vulkan")
    assert "any_as_amax" in [p.name for p in vulkan.passes]
    without = dataclasses.replace(vulkan, passes=tuple(p for p in vulkan.passes if p.name != "any_as_amax"))
    model, inputs = _tiny_lfm2()
    with pytest.raises(LoweringError) as info:
        edgeplug.lower(model, inputs, without)
    first = str(info.value).splitlines()[0]
    assert first.startswith("stage 'partition + delegate' failed for backend 'vulkan' in executorch's ")
    assert "SpecViolationError: Buffer output" in first and "This error is executorch's own" in first
    assert info.value.lowering_stage == "partition + delegate"
