"""Every line edgeplug prints shows text, it does not run it (issue 47): a model's exception message, a
thread name it chose, or a plugin's failure holding terminal controls (an OSC title or clipboard write, a
clear screen, a C1 CSI, a bidi override) reaches stderr as its escape (``\\x1b``) in the ``edgeplug:
error:`` and ``edgeplug: warning:`` lines, as it already did in the report's table."""

from __future__ import annotations

import re

import pytest

#: clear screen, OSC 0 title, OSC 52 clipboard write, C1 CSI, a bidi override
PAYLOAD = "\x1b[2J\x1b]0;owned\x07\x1b]52;c;ZXZpbA==\x07\x9b31m\u202eevil"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture(autouse=True)
def _plain(edgeplug_plain_env, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)


def test_a_model_exception_reaches_the_error_line_escaped(cli, tmp_path):
    model = tmp_path / "m.py"
    model.write_text(f"def build():\n    raise RuntimeError({PAYLOAD!r})\n")
    code, stdout, stderr = cli("lower", f"{model}:build", "-b", "xnnpack", "-q", "-o", tmp_path / "m.pte")
    assert code == 2
    assert not RAW.search(stderr.replace("\n", "")), repr(stderr)
    line = next(x for x in stderr.splitlines() if x.startswith("edgeplug: error:"))
    assert "\\x1b]0;owned\\x07" in line and "\\x1b]52;c;" in line and "\\x9b31m" in line and "\\u202eevil" in line


def test_a_thread_name_and_a_plugin_failure_reach_their_warning_lines_escaped(cli, tmp_path, monkeypatch):
    (tmp_path / "evil_plugin.py").write_text(f"raise ImportError({PAYLOAD!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("EDGEPLUG_REGISTER_PLUGINS", "evil_plugin")
    model = tmp_path / "m.py"
    model.write_text(
        "import threading\n"
        f"threading.Thread(target=threading.Event().wait, args=(5,), name={PAYLOAD!r}, daemon=False).start()\n"
        "def build():\n    raise RuntimeError('stop here')\n"
    )
    code, _, stderr = cli("lower", f"{model}:build", "-b", "xnnpack", "-q", "-o", tmp_path / "m.pte")
    assert code == 2
    assert not RAW.search(stderr.replace("\n", "")), repr(stderr)
    warnings = [x for x in stderr.splitlines() if x.startswith("edgeplug: warning:")]
    assert any("evil_plugin" in w and "\\x1b]52;c;" in w for w in warnings), stderr
    assert any("started thread" in w and "\\x1b]0;owned\\x07" in w for w in warnings), stderr
