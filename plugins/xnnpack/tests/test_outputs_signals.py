"""The outputs of `edgeplug lower` are one set under signals and full disks (issue 47): a SIGTERM arriving
between the renames that put the .pte and the report in place waits until both are in place (before, the .pte
was new, the report old, the old .pte gone, and the message said "nothing was written"), and the message says
what was written; a .pte that does not fit on its disk exits 74, as the README gives a full disk."""

from __future__ import annotations

import os
import signal

import pytest


@pytest.fixture(autouse=True)
def _plain(edgeplug_plain_env, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)


def test_sigterm_between_the_renames_leaves_the_set_whole_and_says_so(cli, tmp_path, monkeypatch):
    (tmp_path / "m.pte").write_bytes(b"old program")
    (tmp_path / "m.json").write_text("old report")
    real, sent = os.replace, []

    def replace(src, dst, *a, **k):
        real(src, dst, *a, **k)
        if not sent and os.fspath(dst).endswith("m.pte"):  # the first of the two renames: SIGTERM now
            sent.append(dst)
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(os, "replace", replace)
    code, _, stderr = cli("lower", "mlp", "-b", "xnnpack", "-q", "-o", "m.pte", "--report", "m.json")
    assert sent and code == 143
    pte, report = (tmp_path / "m.pte").read_bytes(), (tmp_path / "m.json").read_text()
    assert pte != b"old program" and report != "old report" and '"format_version"' in report  # the set, whole
    line = next(x for x in stderr.splitlines() if x.startswith("edgeplug: error:"))
    assert "terminated (SIGTERM)" in line and "m.pte" in line and "m.json" in line and "written whole" in line
    assert "nothing was written" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "m.pte"]  # no temporary, no kept link


def test_sigterm_before_the_renames_writes_nothing_and_says_so(cli, tmp_path, monkeypatch):
    from edgeplug import _outputs

    (tmp_path / "m.pte").write_bytes(b"old program")
    real = _outputs._write_temporary

    def write(tmp, target, data):
        real(tmp, target, data)
        signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(_outputs, "_write_temporary", write)
    code, _, stderr = cli("lower", "mlp", "-b", "xnnpack", "-q", "-o", "m.pte")
    assert code == 143 and "terminated (SIGTERM); nothing was written" in stderr
    assert (tmp_path / "m.pte").read_bytes() == b"old program"
    assert [p.name for p in tmp_path.iterdir()] == ["m.pte"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device whose writes find no room)")
def test_a_pte_that_does_not_fit_exits_74(cli, tmp_path):
    code, _, stderr = cli("lower", "mlp", "-b", "xnnpack", "-q", "-o", "/dev/full")
    assert code == 74, stderr
    line = next(x for x in stderr.splitlines() if x.startswith("edgeplug: error:"))
    assert "/dev/full" in line and "No space left on device" in line
