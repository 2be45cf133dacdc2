"""The coreml backend: the conformance suite, llama lowered for real (CLI and API), what it keeps off Core ML."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

import edgeplug
from edgeplug.testing.conformance import *  # noqa: F401,F403

EDGEPLUG_BACKENDS = ["coreml"]
BACKEND_ID = "CoreMLBackend"
#: the tiny llama example has 5 RMSNorms: two per block (2 blocks) and the final one
NORMS = 5
#: what edgeplug itself prints on stderr while lowering: "   12.3s [coreml] to_edge ..."
PROGRESS = re.compile(r"^\s*\d+\.\d+s \[coreml\] [\w +.\-]+ \.\.\.$")


def _delegates(result) -> list:
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    return [m for _, m, _ in get_lowered_submodules(result.edge.exported_program().graph_module)]


def _ops(gm: torch.fx.GraphModule) -> Counter:
    from edgeplug.plugin import op_name

    return Counter(op_name(n.target) for n in gm.graph.nodes if n.op == "call_function")


@pytest.fixture(scope="session")
def llama_by_cli(tmp_path_factory):
    """``edgeplug lower handwritten-llama-decoder --backend coreml -o llama.pte`` as a user runs it: (process, .pte path, report)."""
    out = tmp_path_factory.mktemp("coreml-cli")
    env = {k: v for k, v in os.environ.items() if k not in ("EDGEPLUG_PLUGINS", "EDGEPLUG_DISABLE_PLUGINS")}
    exe = Path(sys.executable).with_name("edgeplug")
    proc = subprocess.run(
        [str(exe), "lower", "handwritten-llama-decoder", "--backend", "coreml", "-o", str(out / "llama.pte"), "--report", str(out / "llama.json")],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, out / "llama.pte", json.loads((out / "llama.json").read_text())


@pytest.mark.slow
def test_cli_writes_a_pte_with_one_coreml_delegate_and_keeps_core_ml_noise_off_stderr(llama_by_cli):
    from executorch.exir._serialize._program import deserialize_pte_binary

    proc, pte, report = llama_by_cli
    program = deserialize_pte_binary(pte.read_bytes()).program
    delegates = [d.id for plan in program.execution_plan for d in plan.delegates]
    assert delegates == [BACKEND_ID]
    assert report["summary"]["partitions"] == 1 and report["summary"]["cpu_nodes"] == 0, proc.stdout
    fused = [f for f in report["fusions"] if f["pattern"] == "rms_norm" and f["outcome"] == "fused"]
    assert len(fused) == NORMS, proc.stdout
    assert "partitions: 1" in proc.stdout
    # coremltools' version warnings, "Failed to load _MLModelProxy", tqdm bars, executorch's
    # "requested for preservation" warnings: none of it without -v
    noise = [line for line in proc.stderr.splitlines() if line.strip() and not PROGRESS.match(line)]
    assert not noise, "\n".join(noise[:20])
    assert any("[coreml] partition + delegate" in line for line in proc.stderr.splitlines())


def test_every_norm_is_fused_into_aten_rms_norm_inside_the_core_ml_delegate(edgeplug_lowering):
    result = edgeplug_lowering("llama", "coreml")
    assert not result.report.dry_run
    delegates = _delegates(result)
    assert [d.backend_id for d in delegates] == [BACKEND_ID]
    inside = _ops(delegates[0].original_module)
    assert inside["aten.rms_norm.default"] == NORMS, inside
    assert "aten.rsqrt.default" not in inside  # no norm left written out
    assert len(delegates[0].processed_bytes) > 0  # coremltools built a real Core ML program
    # nothing but the delegate call and its outputs outside it
    outside = _ops(result.edge.exported_program().graph_module)
    assert set(outside) <= {"executorch_call_delegate", "getitem"}, outside
    assert result.report.cpu_node_count == 0 and len(result.report.partitions) == 1


class _Attention(torch.nn.Module):
    """Heads split, attended and merged back as transformers writes it: the merge reshapes a transposed tensor."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.out = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, -1))


def test_attention_whose_output_merge_reshapes_a_transposed_tensor_lowers_whole():
    # every node of a kept op is delegable here, so the partitioner gives executorch no per-node check;
    # with one, executorch 1.5 made the merge an invalid view and to_edge failed on every decoder
    result = edgeplug.lower(_Attention().eval(), (torch.randn(1, 6, 32),), "coreml")
    assert [d.backend_id for d in _delegates(result)] == [BACKEND_ID]
    assert result.report.cpu_node_count == 0
    inside = _ops(_delegates(result)[0].original_module)
    assert inside["aten.scaled_dot_product_attention.default"] == 1, inside  # kept whole, not decomposed


class _Scans(torch.nn.Module):
    """Two scans of a rank-4 tensor: along -2 (coremltools refuses that axis) and along -1 (it takes it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=-2) + torch.cumsum(x, -1) * 0.5


def test_a_scan_along_a_negative_dim_other_than_minus_one_reaches_core_ml_with_its_positive_dim():
    x = torch.randn(2, 3, 5, 4)
    result = edgeplug.lower(_Scans(), (x,), "coreml")  # coremltools failed the conversion on cumsum(x, -2)
    [delegate] = _delegates(result)
    scans = [n for n in delegate.original_module.graph.nodes if n.op == "call_function" and "cumsum" in str(n.target)]
    assert sorted(n.args[1] for n in scans) == [-1, 2], [n.args for n in scans]  # -1 is left as it was
    assert result.report.cpu_node_count == 0


class _PartlyDouble(torch.nn.Module):
    """A linear in float32, a scale computed in float64, a relu in float32."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        z = (y.double() * 3.0).float()
        return torch.relu(z)


def test_float64_nodes_stay_on_the_cpu_with_the_reason():
    torch.manual_seed(0)
    result = edgeplug.lower(_PartlyDouble().eval(), (torch.randn(2, 8),), "coreml")
    report = result.report
    assert report.cpu_nodes, report.to_table()
    for node in report.cpu_nodes:  # the casts to and from float64 and the float64 multiply
        assert "Core ML has no float64 tensors" in node.reason, report.to_table()
    assert any(n.op == "aten.mul.Tensor" for n in report.cpu_nodes), report.to_table()
    assert report.delegated_ops.get("aten.linear.default") == 1, report.to_table()
    assert report.delegated_ops.get("aten.relu.default") == 1, report.to_table()
    assert {p.backend_id for p in report.partitions} == {BACKEND_ID}
    assert len(result.buffer) > 0


def test_the_dtype_filter_refuses_complex_and_float64_and_lets_float32_through():
    from edgeplug.plugin import FilterContext

    (record,) = [f for f in edgeplug.get_backend("coreml").records(edgeplug.PartitionerFilter) if f.name == "coreml-dtypes"]

    def node_of(dtype: torch.dtype) -> torch.fx.Node:
        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        x.meta["val"] = torch.empty(2, dtype=dtype)
        y = graph.call_function(torch.ops.aten.neg.default, (x,))
        y.meta["val"] = torch.empty(2, dtype=dtype)
        return y

    ctx = FilterContext(stage="partition", backend="coreml")
    for dtype in (torch.float64, torch.complex64):
        verdict = record.fn(node_of(dtype), ctx)
        assert verdict is not None and not verdict
        assert f"Core ML has no {str(dtype).removeprefix('torch.')} tensors" in verdict.reason
    assert record.fn(node_of(torch.float32), ctx) is None
    assert record.fn(node_of(torch.float16), ctx) is None


def test_symbolic_integers_stay_on_the_cpu_with_their_readers():
    """Core ML programs take tensors only: the .item() of a KV-cache position and the nodes that read a
    symbolic size are refused (a partition taking one failed in Core ML's preprocess); tensor-only nodes pass."""
    from edgeplug.plugin import FilterContext
    from edgeplug.testing.programs import cached_attention

    (record,) = [f for f in edgeplug.get_backend("coreml").records(edgeplug.PartitionerFilter) if f.name == "coreml-tensor-inputs"]
    ep, _ = cached_attention()
    ctx = FilterContext(stage="partition", backend="coreml")
    verdicts = {n.name: record.fn(n, ctx) for n in ep.graph.nodes if n.op == "call_function"}
    item = next(n for n in ep.graph.nodes if str(n.target) in ("aten.item.default", "aten._local_scalar_dense.default"))
    assert verdicts[item.name] is not None and not verdicts[item.name]
    assert "data-dependent integer" in verdicts[item.name].reason
    readers = [n for n in item.users if n.op == "call_function"]
    assert readers and all(verdicts[n.name] is not None and not verdicts[n.name] for n in readers)
    assert any("symbolic integer" in verdicts[n.name].reason for n in readers)
    linears = [n for n in ep.graph.nodes if "linear" in str(n.target)]
    assert linears and all(verdicts[n.name] is None for n in linears)


def test_keep_whole_table_agrees_with_the_partitioners_own_ops_to_not_decompose():
    class Norm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(8))

        def forward(self, x):
            return torch.nn.functional.rms_norm(x, (8,), self.weight, 1e-6)

    coreml = edgeplug.get_backend("coreml")
    ep = torch.export.export(Norm(), (torch.randn(2, 8),))
    present = {n.target for n in ep.graph.nodes if n.op == "call_function"}
    kept, _ = coreml.make_partitioner().ops_to_not_decompose(ep)
    ours = set(coreml.keep_whole)
    assert torch.ops.aten.rms_norm.default in ours
    assert ours & present == ours  # the model holds every op of the table...
    assert ours <= set(kept)  # ...and CoreMLPartitioner keeps each of them whole too


def test_compile_specs_ask_for_fp16_and_ios18():
    import coremltools as ct
    from executorch.backends.apple.coreml.compiler import CoreMLBackend

    specs = edgeplug.get_backend("coreml").make_partitioner().delegation_spec.compile_specs
    assert CoreMLBackend.model_compute_precision_from_compile_specs(specs) == ct.precision.FLOAT16
    assert CoreMLBackend.min_deployment_target_from_compile_specs(specs) == ct.target.iOS18


def test_without_coremltools_the_backend_is_unavailable_and_says_how_to_install_it(monkeypatch):
    from edgeplug._errors import BackendUnavailableError

    # Python's own way to make an import fail: a None entry in sys.modules
    monkeypatch.setitem(sys.modules, "coremltools", None)
    coreml = edgeplug.get_backend("coreml")
    a = coreml.availability()
    assert not a.ok
    assert a.reason.startswith("coremltools is blocked"), a.reason
    assert "pip install coremltools==9.0" in a.hint
    with pytest.raises(BackendUnavailableError, match=r"pip install coremltools==9\.0"):
        edgeplug.lower(_PartlyDouble().eval(), (torch.randn(2, 8),), coreml)


def test_edgeplug_backends_lists_coreml_as_unavailable_without_coremltools(monkeypatch, capsys):
    from edgeplug._cli import main

    monkeypatch.setitem(sys.modules, "coremltools", None)
    monkeypatch.setenv("EDGEPLUG_PLUGINS", "coreml")  # no other backend's probe (the GPU adapter)
    capsys.readouterr()
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("coreml "))
    assert "no: coremltools is blocked" in row, out


def test_the_lowering_context_quiets_core_ml_and_restores_everything_even_on_error():
    import logging

    import tqdm

    quiet = edgeplug.get_backend("coreml").spec.lowering_context
    edgeplug.get_backend("coreml").make_partitioner()  # coremltools and its converters are loaded
    from coremltools.converters.mil.frontend.torch import ops as torch_frontend

    executorch_logger, coremltools_logger = logging.getLogger("executorch"), logging.getLogger("coremltools")
    before = (executorch_logger.level, coremltools_logger.level, list(logging.getLogger().filters))
    executorch_logger.setLevel(logging.ERROR)  # what the CLI does without -v
    try:
        with pytest.raises(RuntimeError, match="inside"):
            with quiet():
                assert not coremltools_logger.isEnabledFor(logging.WARNING)
                assert torch_frontend._tqdm is not tqdm.tqdm and issubclass(torch_frontend._tqdm, tqdm.tqdm)
                assert torch_frontend._tqdm(range(3)).disable
                raise RuntimeError("inside")
        assert torch_frontend._tqdm is tqdm.tqdm
        assert (coremltools_logger.level, list(logging.getLogger().filters)) == before[1:]
        executorch_logger.setLevel(logging.NOTSET)  # -v: Core ML's output is shown as it is
        with quiet():
            assert torch_frontend._tqdm is tqdm.tqdm
    finally:
        executorch_logger.setLevel(before[0])


def test_fusion_policy_follows_the_design_table():
    """DESIGN.md's fusion-policy table: aten.rms_norm kept whole, a leaf [D] weight, computed weights folded,
    a runtime scale after a unit-weight norm, no fp32 accumulation (moved from tests/test_conformance.py)."""
    import edgeplug

    policy = edgeplug.get_backend("coreml").fusion_policy("rms_norm")
    assert policy is not None, "coreml declares no rms_norm fusion policy"
    assert policy.target == "aten.rms_norm"
    assert policy.weight_sources == frozenset({"leaf"})
    assert policy.fold_computed_constants and policy.unit_weight_fallback
    assert policy.fp32_accumulation is False
