"""`edgeplug zoo`'s progress and warning lines show text, they do not run it: a cell's line quotes a model's or a
backend's own words (an error message), so terminal controls in them reach stderr as their escapes, as the
``edgeplug: error:`` lines do (the last leftover of issue 47)."""

from __future__ import annotations

import re

import pytest

from edgeplug._zoo._cli import _printers

PAYLOAD = "\x1b]0;owned\x07\x1b[2J\x9b31m\u202eevil"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


@pytest.mark.parametrize("quiet", [False, True])
def test_progress_and_warning_lines_escape_terminal_controls(capsys, quiet):
    progress, warn = _printers(quiet, interactive=False)
    progress(f"[1/2] llama x npu: failed: {PAYLOAD}")
    warn(f"cell llama x npu: {PAYLOAD}")
    err = capsys.readouterr().err
    assert not RAW.search(err.replace("\n", "")), repr(err)
    assert "\\x1b]0;owned\\x07" in err and "\\u202eevil" in err
    assert ("[1/2] llama" in err) is (not quiet)  # --quiet drops the progress line, never the warning
    assert "edgeplug zoo: warning: cell llama x npu:" in err
