"""The qnn backend: the conformance suite, and what it declares without the QNN SDK."""

from __future__ import annotations

from pathlib import Path

import pytest

import edgeplug
from edgeplug.testing.conformance import *  # noqa: F401,F403

EDGEPLUG_BACKENDS = ["qnn"]


@pytest.fixture(autouse=True)
def _no_sdk(monkeypatch):
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)


def test_without_the_sdk_it_partitions_from_its_support_table():
    from edgeplug._partition import SupportTablePartitioner

    qnn = edgeplug.get_backend("qnn")
    assert qnn.spec.backend_id == "QnnBackend" and qnn.spec.constant_only_policy
    partitioner = qnn.make_partitioner()
    assert isinstance(partitioner, SupportTablePartitioner)
    assert partitioner.delegation_spec.backend_id == "QnnBackend"
    assert edgeplug.get_backend("qnn").availability().reason == "the QNN SDK is not configured (QNN_SDK_ROOT is not set)"


def test_availability_names_what_is_missing_in_the_sdk(monkeypatch, tmp_path):
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path))
    a = edgeplug.get_backend("qnn").availability()
    assert not a.ok and a.reason == f"QNN_SDK_ROOT={tmp_path} has no lib/x86_64-linux-clang/libQnnHtp.so"
    assert "set QNN_SDK_ROOT" in a.hint
    lib = tmp_path / "lib" / "x86_64-linux-clang" / "libQnnHtp.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")  # there, but no library the loader takes
    a = edgeplug.get_backend("qnn").availability()
    assert not a.ok and "libQnnHtp.so is there but does not load" in a.reason and "LD_LIBRARY_PATH" in a.hint
    import torch

    # a real library whose dependencies this process has loaded (torch's)
    lib.write_bytes((Path(torch.__file__).parent / "lib" / "libshm.so").read_bytes())
    assert edgeplug.get_backend("qnn").availability().ok


def test_htp_keeps_its_native_ops_whole():
    aten = __import__("torch").ops.aten
    assert {aten.linear.default, aten.rms_norm.default, aten.hardswish.default} <= set(edgeplug.get_backend("qnn").keep_whole)


def test_fusion_policy_follows_the_design_table():
    """DESIGN.md's fusion-policy table: aten.rms_norm kept whole, a leaf [D] weight, computed weights folded,
    a runtime scale after a unit-weight norm, no fp32 accumulation (moved from tests/test_conformance.py)."""
    import edgeplug

    policy = edgeplug.get_backend("qnn").fusion_policy("rms_norm")
    assert policy is not None, "qnn declares no rms_norm fusion policy"
    assert policy.target == "aten.rms_norm"
    assert policy.weight_sources == frozenset({"leaf"})
    assert policy.fold_computed_constants and policy.unit_weight_fallback
    assert policy.fp32_accumulation is False
