"""The qnn backend's dry run drops the identity copies its real flow drops, and says so in its records.

That qnn's aten.rms_norm fuses on the aten program, before any rewrite whatever its stage, is the core's
test_rewrites_run_after_the_fusion_unless_asked_to_run_before on fixture-keep (the same aten target;
test_backend.py pins qnn's).
"""

from __future__ import annotations

import pytest

import edgeplug


@pytest.fixture(scope="module")
def llama():
    pytest.importorskip("transformers")
    import edgeplug._zoo

    _, ep, inputs, _ = edgeplug._zoo.exported("llama", 1)
    return ep, inputs


def test_the_dry_run_drops_the_copies_the_real_flow_drops_and_says_so(llama):
    if "qnn" not in edgeplug.backends():
        pytest.skip("the qnn plugin is not installed")
    ep, inputs = llama
    report = edgeplug.lower(ep, inputs, "qnn", dry_run=True).report
    assert not report.cpu_ops.get("aten.alias_copy.default") and not report.cpu_ops.get("dim_order_ops._clone_dim_order.default")
    dropped = [t for t in report.transforms if t.transform == "drop_identity_copies"]
    assert {t.op for t in dropped} >= {"aten.alias_copy.default", "dim_order_ops._clone_dim_order.default"}
