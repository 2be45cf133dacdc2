"""A third-party backend written from the author's guide lowers llama for real (issue 20).

``plugins/coreml/tests/fixtures/keepwhole_plugin`` declares a backend over ExecuTorch's
CoreMLPartitioner with ``FusionPolicy(target="aten.rms_norm")`` and
``aten.rms_norm`` kept whole, and nothing else. The core must bring every
fused norm to the partitioner as an op ExecuTorch's verifier accepts, and
CoreMLPartitioner must delegate it: each norm is one ``aten.rms_norm`` inside
the Core ML delegate of a serialized program.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import edgeplug

BACKEND = "fixture-npu"
#: the tiny llama example has 5 RMSNorms: two per block (2 blocks) and the final one
NORMS = 5
SITE = Path(__file__).resolve().parent / "fixtures" / "keepwhole_plugin"


@pytest.mark.slow
def test_a_plugin_declaring_only_the_policy_and_keep_whole_lowers_llama_with_every_norm_in_the_delegate(
    edgeplug_site, monkeypatch
):
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    from edgeplug.plugin import op_name

    from edgeplug.examples import load_model

    monkeypatch.delenv("EDGEPLUG_PLUGINS", raising=False)
    monkeypatch.delenv("EDGEPLUG_DISABLE_PLUGINS", raising=False)
    edgeplug_site(SITE)
    backend = edgeplug.get_backend(BACKEND)
    assert backend.distribution == "edgeplug-fixture-keepwhole"
    assert backend.availability().ok  # a real lowering, not a dry run
    model, inputs, _, _ = load_model("llama")
    result = edgeplug.lower(model, inputs, backend)

    report = result.report
    assert not report.dry_run
    fused = [f for f in report.fusions if f.pattern == "rms_norm" and f.outcome == "fused"]
    assert len(fused) == NORMS, report.to_table()
    delegates = [m for _, m, _ in get_lowered_submodules(result.edge.exported_program().graph_module)]
    inside = Counter(
        op_name(n.target) for d in delegates for n in d.original_module.graph.nodes if n.op == "call_function"
    )
    assert inside["aten.rms_norm.default"] == NORMS, inside
    assert {d.backend_id for d in delegates} == {"CoreMLBackend"}
    assert "aten.rms_norm.default" not in report.cpu_ops, report.to_table()
    program = deserialize_pte_binary(result.buffer).program
    assert "CoreMLBackend" in {d.id for plan in program.execution_plan for d in plan.delegates}
