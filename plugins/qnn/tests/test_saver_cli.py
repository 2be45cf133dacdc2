"""The QNN saver mode from the command line: nothing unrunnable is written as if it ran, and the terminal
holds edgeplug's lines only (issue 37).

Each case is one ``edgeplug lower handwritten-llama-decoder --backend qnn`` in a process of its own with
``EDGEPLUG_QNN_SAVER=1``, the QNN libraries laid out as ``.ci/qnn_saver.sh`` does it
(``QNN_SDK_ROOT``; ``LD_LIBRARY_PATH`` is set here, before the process starts) and a
temporary folder of its own (``TMPDIR``), so that what the run leaves behind is seen. They
skip where the libraries are not laid out, and fail instead under
``EDGEPLUG_QNN_SAVER_REQUIRED=1`` (the CI job that lays them out).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgeplug.testing.conformance import foreign_lines
from edgeplug_qnn import saver

REQUIRED_VAR = "EDGEPLUG_QNN_SAVER_REQUIRED"


@pytest.fixture(scope="module")
def qnn_libs() -> Path:
    """The folder of QNN's x86-64 libraries under ``QNN_SDK_ROOT``."""
    root = os.environ.get(saver.SDK_VAR)
    lib_dir = Path(root) / saver.LIB_DIR if root else None
    if lib_dir is None or not all((lib_dir / lib).is_file() for lib in saver.LIBRARIES):
        why = f"the QNN libraries are not laid out here ({saver.SDK_VAR}/{saver.LIB_DIR.as_posix()}; .ci/qnn_saver.sh)"
        if os.environ.get(REQUIRED_VAR, "") not in ("", "0"):
            pytest.fail(f"{REQUIRED_VAR} is set and {why}", pytrace=False)
        pytest.skip(why)
    return lib_dir


def lower_in_saver_mode(lib_dir: Path, folder: Path, *argv: str, **env: str) -> subprocess.CompletedProcess:
    """``edgeplug lower handwritten-llama-decoder --backend qnn ARGV`` in saver mode, run in ``folder`` with ``folder/tmp`` as TMPDIR."""
    tmp = folder / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    environ = {k: v for k, v in os.environ.items() if k not in (saver.DIR_VAR, "EDGEPLUG_DEBUG")}
    environ.update(
        {saver.MODE_VAR: "1", "TMPDIR": str(tmp), "LD_LIBRARY_PATH": os.pathsep.join(
            [str(lib_dir), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
        )},
        **env,
    )
    return subprocess.run(
        [sys.executable, "-m", "edgeplug._cli", "lower", "handwritten-llama-decoder", "--backend", "qnn", *argv],
        capture_output=True, text=True, timeout=600, cwd=folder, env=environ,
    )


@pytest.fixture(scope="module")
def plain(qnn_libs, tmp_path_factory):
    """``-o q.pte --report r.json``: no flag asking for the stand-in program."""
    folder = tmp_path_factory.mktemp("saver-plain")
    p = lower_in_saver_mode(qnn_libs, folder, "-o", "q.pte", "--report", "r.json")
    assert p.returncode == 0, p.stderr[-3000:]
    return folder, p, json.loads((folder / "r.json").read_text())


def test_no_pte_is_written_under_the_requested_name_nor_the_default_one(plain):
    folder, p, report = plain
    assert sorted(f.name for f in folder.iterdir()) == ["r.json", "tmp"]  # no q.pte, llama-qnn.pte, q.stand-in.pte
    assert "q.pte was not written (--write-stand-in writes it as q.stand-in.pte)" in report["notes"]
    assert report["output_path"] is None and "wrote q.pte" not in p.stdout


def test_the_report_says_the_delegates_hold_stand_ins_and_is_no_real_lowering(plain):
    _folder, _p, report = plain
    held = report["stand_in"]
    assert report["dry_run"] is True  # no delegate holds a compiled program
    assert held["kind"] == "backend" and held["delegates"] == len(report["partitions"]) == 1
    assert held["reason"].startswith("QNN saver mode (EDGEPLUG_QNN_SAVER=1): the QNN delegate holds a stand-in payload")
    assert held["reason"] in report["notes"] and held["written"] is None


def test_the_recording_folder_is_in_the_report_and_gone_after_the_run(plain):
    folder, _p, report = plain
    held = report["stand_in"]
    assert Path(held["recording"]).parent == folder / "tmp" and held["recording_kept"] is False
    assert any(held["recording"] in n and "removed when the process ends" in n and saver.DIR_VAR in n for n in report["notes"])
    assert list((folder / "tmp").glob("edgeplug-*")) == []  # no folder left behind


def test_the_terminal_holds_one_edgeplug_line_about_it_and_no_library_output(plain):
    _folder, p, _report = plain
    said = [line for line in p.stderr.splitlines() if "not runnable" in line]
    assert said == [
        "edgeplug: not runnable: QNN saver mode (EDGEPLUG_QNN_SAVER=1): the QNN delegate holds a stand-in payload "
        "(what QNN's saver recorded), not a context binary, so this program does not run; q.pte was not written "
        "(--write-stand-in writes it as q.stand-in.pte)"
    ]
    assert foreign_lines(p.stderr) == [], p.stderr  # no [INFO] [Qnn ExecuTorch], no WARNING:... records
    # nor on stdout, where a .pte may be streamed (QNN's libraries print a LIBNATIVE line there)
    assert "[Qnn ExecuTorch]" not in p.stdout and "LIBNATIVE" not in p.stdout


def test_write_stand_in_writes_the_stand_in_name_only_and_a_kept_recording_stays(qnn_libs, tmp_path):
    kept = tmp_path / "kept"
    p = lower_in_saver_mode(qnn_libs, tmp_path, "-o", "q.pte", "--report", "r.json", "--write-stand-in", **{saver.DIR_VAR: str(kept)})
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert not (tmp_path / "q.pte").exists()
    written = tmp_path / "q.stand-in.pte"
    assert saver.PAYLOAD_MAGIC in written.read_bytes()
    held = report["stand_in"]
    assert (held["written"], report["output_path"]) == ("q.stand-in.pte", "q.stand-in.pte")
    assert held["recording"] == str(kept) and held["recording_kept"] is True
    assert (kept / "saver_output.c").is_file() and list(kept.glob("forward-*.c"))  # kept where asked
    assert list((tmp_path / "tmp").glob("edgeplug-*")) == []
    assert [line for line in p.stderr.splitlines() if "not runnable" in line][0].endswith("wrote it as q.stand-in.pte")
    assert foreign_lines(p.stderr) == [], p.stderr


def test_with_v_the_libraries_log_reaches_the_terminal(qnn_libs, tmp_path):
    # the quiet check above can fail: what it keeps off the terminal is there with -v
    p = lower_in_saver_mode(qnn_libs, tmp_path, "-o", "q.pte", "-v")
    assert p.returncode == 0, p.stderr[-3000:]
    assert any("[Qnn ExecuTorch]" in line for line in foreign_lines(p.stderr)), p.stderr[-3000:]
    assert not (tmp_path / "q.pte").exists()
