"""`edgeplug report FILE` reads what a lowering wrote, and nothing without end (issue 47): a saved report
holding NaN or Infinity (not strict JSON; edgeplug writes null there) is refused naming the field; a file
or device larger than any report (``/dev/zero``) is refused after the cap, not read until memory runs out.
And ``EDGEPLUG_DEBUG`` set to something that is neither on nor off is one warning line, not a traceback
for the user's own error."""

from __future__ import annotations

import json
import os

import pytest
import torch

import edgeplug


@pytest.fixture(autouse=True)
def _plain(edgeplug_plain_env, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A real report (a fixture backend's dry run of a tiny model), as `--report X.json` writes it."""
    import edgeplug_fixture_backends as fb  # tests/fixtures/backends (put on the path by conftest)

    with fb.registered():
        result = edgeplug.lower(torch.nn.Linear(4, 4).eval(), (torch.randn(2, 4),), fb.TABLE, dry_run=True)
    path = tmp_path_factory.mktemp("report") / "r.json"
    path.write_text(result.report.to_json())
    return path


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_saved_report_holding_a_non_finite_number_is_refused_naming_the_field(cli, saved, tmp_path, constant):
    text = saved.read_text()
    data = json.loads(text)
    assert data["stages"], "the report has stage timings to tamper with"
    data["stages"][0]["seconds"] = "@@"
    tampered = tmp_path / "t.json"
    tampered.write_text(json.dumps(data).replace('"@@"', constant))
    code, stdout, stderr = cli("report", tampered, "--html", tmp_path / "t.html")
    assert code == 2 and stdout == ""
    line = next(x for x in stderr.splitlines() if x.startswith("edgeplug: error:"))
    assert f"holds {constant} at stages[0].seconds" in line and "strict JSON" in line
    assert not (tmp_path / "t.html").exists()
    code, stdout, _ = cli("report", saved)  # the file as edgeplug wrote it reads
    assert code == 0 and "stages" in stdout


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_report_without_end_is_refused_at_the_cap(cli):
    code, stdout, stderr = cli("report", "/dev/zero")
    assert code == 2 and stdout == ""
    line = next(x for x in stderr.splitlines() if x.startswith("edgeplug: error:"))
    assert "/dev/zero holds more than 64 MiB" in line and "bug" not in line


@pytest.mark.parametrize("value", ["maybe", "2", "debug"])
def test_an_unrecognised_debug_value_is_one_line_and_no_traceback(cli, monkeypatch, value):
    monkeypatch.setenv("EDGEPLUG_DEBUG", value)
    code, _, stderr = cli("report", "no-such-report.json")
    assert code == 2
    assert "Traceback" not in stderr
    warning = [x for x in stderr.splitlines() if x.startswith("edgeplug: warning:")]
    assert len(warning) == 1 and f"EDGEPLUG_DEBUG='{value}' is neither on" in warning[0]
    assert any(x.startswith("edgeplug: error: cannot read the report no-such-report.json") for x in stderr.splitlines())
    monkeypatch.setenv("EDGEPLUG_DEBUG", "1")  # on: the traceback, and no warning
    code, _, stderr = cli("report", "no-such-report.json")
    assert code == 2 and "Traceback" in stderr and "edgeplug: warning:" not in stderr
