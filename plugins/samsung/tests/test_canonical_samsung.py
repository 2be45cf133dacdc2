"""The samsung backend's dry run drops the identity copies its real flow drops, and says so in its records."""

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
    if "samsung" not in edgeplug.backends():
        pytest.skip("the samsung plugin is not installed")
    ep, inputs = llama
    report = edgeplug.lower(ep, inputs, "samsung", dry_run=True).report
    assert not report.cpu_ops.get("aten.alias_copy.default") and not report.cpu_ops.get("dim_order_ops._clone_dim_order.default")
    dropped = [t for t in report.transforms if t.transform == "drop_identity_copies"]
    assert {t.op for t in dropped} >= {"aten.alias_copy.default", "dim_order_ops._clone_dim_order.default"}
