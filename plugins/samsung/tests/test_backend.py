"""The samsung backend: the conformance suite, and what it declares without the Exynos SDK."""

from __future__ import annotations

import pytest

import edgeplug
from edgeplug.testing.conformance import *  # noqa: F401,F403

EDGEPLUG_BACKENDS = ["samsung"]


@pytest.fixture(autouse=True)
def _no_sdk(monkeypatch):
    monkeypatch.delenv("EXYNOS_AI_LITECORE_ROOT", raising=False)


def test_without_the_sdk_it_partitions_from_its_support_table():
    from edgeplug._partition import SupportTablePartitioner

    samsung = edgeplug.get_backend("samsung")
    assert samsung.spec.backend_id == "EnnBackend"
    partitioner = samsung.make_partitioner()
    assert isinstance(partitioner, SupportTablePartitioner)
    assert partitioner.delegation_spec.backend_id == "EnnBackend"


def test_availability_says_what_is_missing(monkeypatch, tmp_path):
    samsung = edgeplug.get_backend("samsung")
    a = samsung.availability()
    assert a.reason == "the Exynos AI LiteCore SDK is not configured (EXYNOS_AI_LITECORE_ROOT is not set)"
    assert "set EXYNOS_AI_LITECORE_ROOT to its root" in a.hint
    monkeypatch.setenv("EXYNOS_AI_LITECORE_ROOT", str(tmp_path / "nowhere"))
    assert samsung.availability().reason == f"EXYNOS_AI_LITECORE_ROOT={tmp_path / 'nowhere'} is not a folder"
    monkeypatch.setenv("EXYNOS_AI_LITECORE_ROOT", str(tmp_path))
    a = samsung.availability()  # an SDK folder, but executorch was built without the ENN wrapper
    assert not a.ok and a.reason.startswith("executorch's ENN wrapper is not built")
    assert "Samsung backend" in a.hint


def test_fusion_policy_follows_the_design_table():
    """DESIGN.md's fusion-policy table: aten.rms_norm kept whole, a leaf [D] weight, computed weights folded,
    a runtime scale after a unit-weight norm, no fp32 accumulation (moved from tests/test_conformance.py)."""
    import edgeplug

    policy = edgeplug.get_backend("samsung").fusion_policy("rms_norm")
    assert policy is not None, "samsung declares no rms_norm fusion policy"
    assert policy.target == "aten.rms_norm"
    assert policy.weight_sources == frozenset({"leaf"})
    assert policy.fold_computed_constants and policy.unit_weight_fallback
    assert policy.fp32_accumulation is False
