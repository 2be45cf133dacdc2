"""samsung's dry runs are strict: real lowerings (ExecuTorch's IR checks on) with a stand-in preprocess.

No Exynos SDK here, so samsung lowers as a dry run. Each of llama (edgeplug's
example) and a 1-layer gemma-style and qwen3-style transformers decoder
(edgeplug._zoo) passes the dry run with every RMSNorm fused into
``aten.rms_norm``, kept whole through to_edge and delegated to ENN, as the
real flow would need it.
"""

from __future__ import annotations


import pytest
import torch

import edgeplug

MODELS = ("llama", "gemma3", "qwen3")


def _zoo():
    import edgeplug._zoo

    return edgeplug._zoo


@pytest.fixture(scope="session")
def samsung_dry_runs():
    """model -> (norms in the exported program, its samsung dry run)."""
    from edgeplug.examples.llama import tiny_llama

    zoo = _zoo()
    out = {}
    for name in MODELS:
        model, inputs = tiny_llama() if name == "llama" else zoo.build(name, layers=1)
        with torch.no_grad():
            norms = zoo.count_norms(torch.export.export(model, inputs))
        out[name] = (norms, edgeplug.lower(model, inputs, "samsung", dry_run=True, model_name=name))
    return out


@pytest.mark.parametrize("model", MODELS)
def test_the_dry_run_fuses_every_norm_and_delegates_it_to_enn(samsung_dry_runs, model):
    norms, result = samsung_dry_runs[model]
    report = result.report
    assert report.dry_run and result.program is None  # nothing kept, though it lowered and serialized
    assert norms > 0
    fused = [f for f in report.fusions if f.outcome != "rejected"]
    assert len(fused) == norms, [(f.anchor, f.outcome, f.reason) for f in report.fusions]
    assert report.delegated_ops.get("aten.rms_norm.default") == norms
    assert "aten.rms_norm.default" not in report.cpu_ops
    assert {p.backend_id for p in report.partitions} == {"EnnBackend"}


def test_the_fused_norms_reach_the_partitioner_as_valid_edge_ops(samsung_dry_runs):
    """The dry run lowered with ExecuTorch's edge verifier on: each partition holds aten.rms_norm
    as an edge op, which the verifier accepts only for an op kept whole from the aten program."""
    from executorch.exir.dialects.edge._ops import EdgeOpOverload
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    _norms, result = samsung_dry_runs["llama"]
    edge = result.edge.exported_program()
    ops = [
        n.target
        for _name, lowered, _node in get_lowered_submodules(edge.graph_module)
        for n in lowered.original_module.graph.nodes
        if n.op == "call_function" and "rms_norm" in str(n.target)
    ]
    assert len(ops) == 5 and all(isinstance(op, EdgeOpOverload) for op in ops)
