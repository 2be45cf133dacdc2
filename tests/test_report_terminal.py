"""The report's text form shows names, it does not run them: a model name, a plugin's reason or a saved
report's string holding terminal controls (ESC sequences that recolour, retitle or move the cursor;
NUL, BEL, backspace, carriage return; the bidirectional overrides that reorder a line) reaches the
terminal as its escape (``\\x1b``, ``\\u202e``), through ``LoweringReport.to_table`` and ``edgeplug report``.
"""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest
import torch

import edgeplug

#: what a terminal acts on: ESC [ (CSI), OSC title, NUL, BEL, backspace, CR, C1 CSI, bidi override and isolate
PAYLOAD = "\x1b[2J\x1b]0;owned\x07\x00\x08\r\x9b31m\u202eevil\u2066x\u2069"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x))


@pytest.fixture(scope="module")
def saved_report(tmp_path_factory):
    """A dry-run lowering's report, its model named by the payload, saved as JSON."""
    import edgeplug_fixture_backends as fb

    with fb.registered():
        result = edgeplug.lower(_Tiny().eval(), (torch.randn(2, 4),), fb.KEEP, dry_run=True, model_name=f"m{PAYLOAD}")
    path = tmp_path_factory.mktemp("terminal") / "r.json"
    path.write_text(result.report.to_json())
    return result.report, path


def test_the_table_shows_each_control_as_its_escape(saved_report):
    report, _ = saved_report
    table = report.to_table()
    assert report.model == f"m{PAYLOAD}"  # the record keeps the name as it is; only its text form escapes it
    assert not RAW.findall(table), sorted(set(RAW.findall(table)))
    assert "m\\x1b[2J\\x1b]0;owned\\x07\\x00\\x08\\r\\x9b31m\\u202eevil\\u2066x\\u2069" in table
    assert "\n" in table and "\t" not in PAYLOAD  # lines stay lines


def test_edgeplug_report_of_a_tampered_file_prints_no_control(saved_report, tmp_path):
    """Every string of a saved report gains the payload (as a hostile file would); the command prints escapes."""
    from edgeplug._cli import main

    _, path = saved_report
    data = json.loads(path.read_text())

    def tamper(v, key=None):  # the fields whose values are a fixed set stay valid
        if isinstance(v, dict):
            return {k: tamper(x, k) for k, x in v.items()}
        if isinstance(v, list):
            return [tamper(x, key) for x in v]
        return v + PAYLOAD if isinstance(v, str) and v and key not in ("kind", "outcome", "pattern") else v

    tampered = tmp_path / "t.json"
    tampered.write_text(json.dumps(tamper(data)))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["report", str(tampered)])
    assert code == 0, err.getvalue()
    printed = out.getvalue()
    assert printed.count("\\u202eevil") >= 2, printed  # the model's name and at least one more tampered string
    assert not RAW.findall(printed), sorted(set(RAW.findall(printed)))
