"""The `edgeplug` command line on the xnnpack backend (the command line itself is the core's tests/test_cli.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from edgeplug.testing import backends_row, delegate_ids

pytestmark = pytest.mark.usefixtures("edgeplug_plain_env", "_in_tmp_path")


@pytest.fixture
def _in_tmp_path(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)


def test_lower_mlp_for_xnnpack_verifies_and_writes_pte_and_report(edgeplug_cli, tmp_path):
    out, rep = tmp_path / "out" / "mlp.pte", tmp_path / "reports" / "mlp.json"
    code, stdout, stderr = edgeplug_cli("lower", "mlp", "--backend", "xnnpack", "--verify", "-o", out, "--report", rep)
    assert code == 0, stderr
    # progress, stage by stage, on stderr
    for stage in ("export", "to_edge", "serialize .pte", "verify"):
        assert f"[xnnpack] {stage} ..." in stderr
    # the table
    assert "edgeplug lowering report: mlp -> xnnpack [edgeplug-xnnpack 0.1.0]" in stdout
    assert "partitions: 1 (delegated 3 nodes)" in stdout
    assert f"wrote {out} ({out.stat().st_size:,} bytes)" in stdout
    diff = float(re.search(r"max \|difference\| vs eager = (\S+)", stdout).group(1))
    assert diff < 1e-4
    # the .pte is real: executorch reads it back and it names the delegate
    assert delegate_ids(out.read_bytes()) == {"XnnpackBackend"}
    # the JSON report
    data = json.loads(rep.read_text())
    assert data["backend"] == "xnnpack" and data["model"] == "mlp" and data["dry_run"] is False
    assert data["output_path"] == str(out) and data["output_bytes"] == out.stat().st_size
    assert data["summary"] == {
        "partitions": 1, "delegated_nodes": 3, "cpu_nodes": 0, "max_abs_diff": pytest.approx(diff, rel=1e-3), "verified": True
    }
    check = data["verification"]["outputs"][0]
    assert check["tolerance"] == 1e-4 and check["tolerance_reason"] == "default for float32 outputs"
    assert check["problems"] == [] and check["dtype"] == "float32"
    assert [p["backend_id"] for p in data["partitions"]] == ["XnnpackBackend"]
    assert {s["stage"] for s in data["stages"]} >= {"export", "to_edge", "serialize .pte", "verify"}
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["mlp.json", "mlp.pte"]


@pytest.mark.slow
def test_without_o_the_pte_gets_the_default_name_in_the_working_directory(edgeplug_cli):
    # (llama on xnnpack verifying below 1e-4 is the conformance suite's test_verification_matches_eager)
    code, stdout, stderr = edgeplug_cli("lower", "mlp", "--backend", "xnnpack", "-q")
    assert code == 0, stderr
    assert Path("mlp-xnnpack.pte").is_file() and delegate_ids(Path("mlp-xnnpack.pte").read_bytes()) == {"XnnpackBackend"}


def test_backends_row(edgeplug_cli):
    code, out, err = edgeplug_cli("backends", "--no-adapter")
    assert code == 0, err
    assert backends_row(out, "xnnpack").split()[:5] == ["xnnpack", "edgeplug-xnnpack", "0.1.0", "pte", "yes"]
