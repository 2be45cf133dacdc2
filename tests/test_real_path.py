"""The real path of a kept-whole fusion, and a dry run as strict as a real lowering (issue 20).

A backend over a real executorch partitioner and a real ``BackendDetails``
(its preprocess serializes the partition's graph as text, so the ``.pte``
holds what the delegate received) keeps ``aten.rms_norm`` whole and fuses
every RMSNorm into it. Its real lowering and its dry run go through the same
checks: ExecuTorch's edge verifier, the stranded-op check, serialization.
"""

from __future__ import annotations

import pytest
import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult

import edgeplug
from edgeplug._errors import LoweringError
from edgeplug.plugin import Availability, BackendSpec, FusionPolicy, KeepWhole, PassSpec

BACKEND = "strict-npu"


class StrictNpuBackend(BackendDetails):
    """Serializes what it is given: the partition's ops, one per line."""

    @staticmethod
    def preprocess(edge_program, compile_specs):
        ops = [str(n.target) for n in edge_program.graph_module.graph.nodes if n.op == "call_function"]
        return PreprocessResult(processed_bytes="\n".join(ops).encode())


def _edge_ops(exported) -> set:
    from executorch.exir import to_edge

    ops = set()
    for n in to_edge(exported).exported_program().graph_module.graph.nodes:
        if n.op == "call_function" and hasattr(n.target, "_op"):
            ops.add(n.target._op)
    return ops


class _Plugin:
    """A backend declared as the guide says: a support table, keep-whole, an aten.rms_norm policy."""

    def __init__(self, supported, extra_passes=()):
        self.supported = supported
        self.extra_passes = extra_passes

    @edgeplug.hookimpl
    def edgeplug_backends(self):
        from edgeplug.plugin import SupportTablePartitioner

        yield BackendSpec(
            backend=BACKEND,
            description="a kept-whole rms_norm NPU (test)",
            backend_id="StrictNpuBackend",
            partitioner=lambda: SupportTablePartitioner(
                "StrictNpuBackend", self.supported, keep_whole=[torch.ops.aten.rms_norm.default], name="strict-npu"
            ),
            availability=lambda: Availability(ok=True),
            verify_method="none",
        )

    @edgeplug.hookimpl
    def edgeplug_keep_whole(self):
        yield KeepWhole(backend=BACKEND, ops=(torch.ops.aten.rms_norm.default,))

    @edgeplug.hookimpl
    def edgeplug_fusion_policies(self):
        yield FusionPolicy(backend=BACKEND, pattern="rms_norm", target="aten.rms_norm")

    @edgeplug.hookimpl
    def edgeplug_passes(self):
        yield from self.extra_passes


@pytest.fixture(scope="module")
def table(llama_exported):
    return [*_edge_ops(llama_exported), torch.ops.aten.rms_norm.default]


def _lower(llama_example, dry_run):
    model, inputs = llama_example
    return edgeplug.lower(model, inputs, BACKEND, dry_run=dry_run)


def _delegate_payloads(result) -> list[str]:
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    gm = result.edge.exported_program().graph_module
    return [lowered.processed_bytes.decode() for _, lowered, _ in get_lowered_submodules(gm)]


def test_kept_whole_fusion_lowers_for_real_and_dry_run_alike(edgeplug_register, llama_example, table):
    edgeplug_register(_Plugin(table), "strict-npu-plugin")
    real = _lower(llama_example, dry_run=False)
    dry = _lower(llama_example, dry_run=True)

    fused = [f for f in real.report.fusions if f.outcome != "rejected"]
    assert len(fused) == 5 and not [f for f in real.report.fusions if f.outcome == "rejected"]
    # the graph, not the record: every norm reached the delegate as aten.rms_norm
    payload = "\n".join(_delegate_payloads(real))
    assert payload.count("aten.rms_norm.default") == 5
    assert "aten.rsqrt" not in payload and "aten.pow" not in payload
    assert real.report.delegated_ops.get("aten.rms_norm.default") == 5
    assert len(real.buffer) > 0

    # the dry run went through the same partitions, lowered to the stand-in, and wrote nothing
    assert dry.program is None and dry.report.dry_run
    assert [(p.backend_id, p.ops) for p in dry.report.partitions] == [(p.backend_id, p.ops) for p in real.report.partitions]
    assert dry.report.cpu_ops == real.report.cpu_ops
    assert [f.outcome for f in dry.report.fusions] == [f.outcome for f in real.report.fusions]
    assert all(p.backend_id == "StrictNpuBackend" for p in dry.report.partitions)


def _edge_positive_pass(ep):
    """An edge-stage pass that adds aten.positive (an identity, but not core ATen) after to_edge,
    where ExecuTorch's verifier refuses it."""
    graph = ep.graph_module.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and "aten.add.Tensor" in str(node.target):
            with graph.inserting_after(node):
                new = graph.call_function(torch.ops.aten.positive.default, (node,))
            new.meta["val"] = node.meta["val"]
            node.replace_all_uses_with(new, delete_user_cb=lambda user: user is not new)
            return ep
    raise AssertionError("the test model has no add")


def test_dry_run_rejects_what_the_real_run_rejects(edgeplug_register, llama_example, table):
    bad = PassSpec(backend=BACKEND, stage="edge", name="edge_positive", fn=_edge_positive_pass)
    edgeplug_register(_Plugin(table, extra_passes=(bad,)), "strict-npu-plugin")
    model, inputs = llama_example
    failures = {}
    for dry_run in (False, True):
        with pytest.raises(LoweringError) as info:
            edgeplug.lower(model, inputs, BACKEND, dry_run=dry_run)
        failures[dry_run] = (getattr(info.value, "lowering_stage", None), str(info.value))
    assert failures[True] == failures[False]  # same stage, same message
    stage, msg = failures[True]
    assert stage == "partition + delegate"
    # ExecuTorch's verifier refused it, and the pass that made the op is named (not executorch)
    assert "SpecViolationError" in msg and "aten.positive.default" in msg
    assert "edge-stage pass 'edge_positive' of backend 'strict-npu'" in msg and "strict-npu-plugin" in msg
    assert "executorch's own" not in msg


def test_no_fusion_where_the_kept_whole_op_would_not_be_delegated(edgeplug_register, llama_example, llama_exported):
    """A backend that keeps aten.rms_norm whole but whose table does not take it: the core does not
    fuse what would be stranded on the CPU, and says why for each norm."""
    table = list(_edge_ops(llama_exported))  # no aten.rms_norm
    edgeplug_register(_Plugin(table), "strict-npu-plugin")
    model, inputs = llama_example
    report = edgeplug.lower(model, inputs, BACKEND, dry_run=True).report
    assert "aten.rms_norm.default" not in report.delegated_ops and "aten.rms_norm.default" not in report.cpu_ops
    assert len(report.fusions) == 5
    assert all(f.outcome == "rejected" and "would not delegate aten.rms_norm" in f.reason for f in report.fusions)
    assert not report.kept_whole_on_cpu


def test_a_module_whose_input_shadows_a_builtin_lowers(edgeplug_register, table):
    """nn.Sequential(Linear, ...) names its input ``input``: the export-stage fusion's copy of the
    program must keep the signature consistent (it failed 'placeholders ... do not match')."""
    edgeplug_register(_Plugin(table), "strict-npu-plugin")
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()
    report = edgeplug.lower(model, (torch.randn(2, 4),), BACKEND, dry_run=True).report
    assert report.partitions and report.fusions == []
