"""Fault injection on vulkan: executorch's own failures (a pass its pass manager reports, its Vulkan preprocess
refusing a compile spec) are named as executorch's, with the stage; the LFM2 model stock executorch fails on lowers.

Moved from the core's tests/test_faults.py (issue 23). That a corrupted weight fails --verify is the
conformance suite's test_verification_fails_on_a_corrupted_weight (test_backend.py runs it for vulkan).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import edgeplug


@pytest.fixture(autouse=True)
def _in_tmp_path(edgeplug_plain_env, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)


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
def test_lfm2_on_vulkan_lowers_and_verifies_where_stock_executorch_fails(edgeplug_cli, tmp_path):
    # stock to_edge_transform_and_lower with VulkanPartitioner fails on this model inside
    # executorch ("SpecViolationError: Buffer output ... does not point to a buffer that
    # exists": the safe softmax's any.dim split the graph, a partition returned a buffer
    # mutation); with the delegate's any_as_amax rewrite it is one partition
    (tmp_path / "lfm2.py").write_text(
        "import sys\nsys.path.insert(0, %r)\nfrom test_faults_vulkan import _tiny_lfm2 as make\n" % str(Path(__file__).parent)
    )
    out = tmp_path / "lfm2.pte"
    code, stdout, stderr = edgeplug_cli("lower", f"{tmp_path / 'lfm2.py'}:make", "-b", "vulkan", "--verify", "-o", out, "-q")
    assert code == 0, stderr
    assert out.exists() and out.stat().st_size > 0


def _partitioner_with_a_zero_constant_limit():
    # the compile spec as a plugin could write it by hand, past VulkanPartitioner's option parsing
    # (which refuses 0): executorch's vulkan_preprocess checks it again and raises
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    partitioner = VulkanPartitioner()
    partitioner.delegation_spec.compile_specs.append(
        CompileSpec("external_constants_max_data_bytes", (0).to_bytes(8, "little"))
    )
    return partitioner


def test_an_executorch_failure_names_executorch_and_the_stage_it_happens_in():
    # executorch's Vulkan preprocess refuses the delegate's compile spec: the error is executorch's,
    # in partitioning + delegation (not 'to_edge', the stage executorch's call belongs to)
    import dataclasses

    from edgeplug._errors import LoweringError

    vulkan = edgeplug.get_backend("vulkan")
    backend = dataclasses.replace(
        vulkan, spec=vulkan.spec.model_copy(update={"partitioner": _partitioner_with_a_zero_constant_limit})
    )
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    with pytest.raises(LoweringError) as info:
        edgeplug.lower(model, (torch.randn(2, 8),), backend)
    first = str(info.value).splitlines()[0]
    assert first.startswith("stage 'partition + delegate' failed for backend 'vulkan' in executorch's ")
    assert "vulkan_preprocess" in first
    assert "ValueError: external_constants_max_data_bytes must be a positive uint64" in first
    assert "This error is executorch's own" in first
    assert info.value.lowering_stage == "partition + delegate"
    assert info.value.at_fault.startswith("executorch's ")
    assert not list(Path.cwd().iterdir())  # nothing written
