"""The zoo's results file (its journal) and its runs under abuse, through ``edgeplug zoo``.

With ``--resume``: lines that hold no cell (cut short, garbage, JSON of another shape) are named on one
warning line and skipped, their cells run again, and the file is only ever appended to; a file that is no
journal at all is refused untouched; a second run on a journal that a run is writing is refused. ``--out``
and ``--markdown`` are checked by lower's output rules before any cell runs. A model function that exits
is its own cell's outcome (a hang and a memory hog: tests/test_zoo.py, under both executors). A Ray cluster
that can never run a cell, or an address that does not answer, ends the run within its timeout, named.

The runs that reach no cell run in this process (``cli``); the ones with cell processes, or Ray, run the
command in a subprocess with the fixture backends in its environment.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import edgeplug_fixture_backends as fb

FIXTURE_PATH = str(Path(fb.__file__).resolve().parent)
SETTINGS = {"compare_stock": False, "layers": None, "repeat": 1}

#: model functions that log each start (so a test sees whether a cell ran), then misbehave
MODELS = '''
import os, sys, time

LOG = {log!r}


def _started(name):
    with open(LOG, "a") as f:
        f.write(name + "\\n")


def exits():
    _started("exits")
    sys.exit(3)


def dies():
    _started("dies")
    os._exit(7)


def hangs():
    _started("hangs")
    time.sleep(3600)


def raises():
    _started("raises")
    raise ValueError("no model here")
'''


@pytest.fixture
def models(tmp_path):
    """(FILE.py, the log of starts): the model functions above, written into the test's folder."""
    log = tmp_path / "starts.log"
    path = tmp_path / "models.py"
    path.write_text(MODELS.format(log=str(log)))
    return path, log


def _env() -> dict:
    path = os.pathsep.join(p for p in (FIXTURE_PATH, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "EDGEPLUG_REGISTER_PLUGINS": fb.__name__, "EDGEPLUG_PLUGINS": "edgeplug-fixture-backends",
            "PYTHONPATH": path, "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp")}


def _zoo(*argv, timeout=240) -> subprocess.CompletedProcess:
    """``edgeplug zoo ARGV`` in a fresh process that sees the fixture backends."""
    command = [sys.executable, "-m", "edgeplug._cli", "zoo", *map(str, argv)]
    return subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=timeout)


def _line(model: str, **fields) -> str:
    """A results line as a run writes it: the cell ``model`` x fixture-table, float."""
    from edgeplug._zoo import Cell

    cell = Cell(model=model, backend=fb.TABLE, error="build/export: recorded earlier", **fields)
    return json.dumps({**cell.to_dict(), "settings": SETTINGS}, sort_keys=True) + "\n"


def _starts(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_resume_skips_lines_that_hold_no_cell_names_them_and_only_appends(models, tmp_path, zoo):
    path, log = models
    exits, raises = (f"{path.resolve()}:{f}" for f in ("exits", "raises"))
    out = tmp_path / "cells.jsonl"
    cut = _line(raises)[:40]  # the last line, cut short by a run killed mid-write: its cell runs again
    text = (
        _line(exits)
        + "garbage \ufffd here\n"
        + "42\n"
        + json.dumps({"model": "x"}) + "\n"
        + _line("elsewhere.py:f", attempts="many")
        + json.dumps({**json.loads(_line("other.py:f")), "edgeplug": {"seconds": "slow"}}) + "\n"
        + json.dumps({**json.loads(_line("other.py:g")), "status": "exploded"}) + "\n"
        + cut
    )
    out.write_text(text)
    run = _zoo("--models", f"{path}:exits,{path}:raises", "--backends", fb.TABLE, "--schemes", "float",
               "--out", out, "--resume", "--quiet")
    assert run.returncode == 0, run.stderr
    [warning] = [x for x in run.stderr.splitlines() if "warning" in x]  # one line, shown under --quiet too
    assert warning.startswith(f"edgeplug zoo: warning: {out}: skipped 7 lines that hold no cell (line 2: not JSON; "
                              "line 3: not a cell: a JSON int, not an object; line 4: not a cell: no 'backend'; "
                              "line 5: not a cell: 'attempts' is 'many', not an integer; "
                              "line 6: not a cell: 'edgeplug.seconds' is 'slow', not a number or null; "
                              "and 2 more); they stay in the file"), warning
    assert _starts(log) == ["raises"]  # exits was recorded; raises, cut short, ran again
    after = out.read_text()
    assert after.startswith(text + "\n"), "the file was rewritten, not appended to"  # the cut line stays alone
    [again] = after[len(text) + 1:].splitlines()
    assert json.loads(again)["model"] == raises and "no model here" in json.loads(again)["error"]
    assert {c.label for c in zoo.load_cells(str(out))} == {"exits (models.py)", "raises (models.py)"}
    assert "2 cells: 2 failed" in run.stdout

    # resumed again: nothing runs, and the same lines are named again
    rerun = _zoo("--models", f"{path}:exits,{path}:raises", "--backends", fb.TABLE, "--schemes", "float",
                 "--out", out, "--resume", "--quiet")
    assert rerun.returncode == 0 and _starts(log) == ["raises"], rerun.stderr
    assert "skipped 7 lines" in rerun.stderr and out.read_text() == after


def test_a_file_that_is_no_journal_is_refused_untouched(cli, fixture_backends, models, tmp_path, zoo):
    path, log = models
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"my notes\n\x00\xff binary\n")
    code, _, err = cli("zoo", "--models", f"{path}:exits", "--backends", fb.TABLE, "--out", notes, "--resume")
    assert code == 2 and f"{notes} is not a zoo results file (line 1: not JSON, and no line holds a cell)" in err, err
    assert notes.read_bytes() == b"my notes\n\x00\xff binary\n" and not log.exists()
    # not the same as a journal whose only line a crash cut short: that one resumes, the line skipped
    first = tmp_path / "first.jsonl"
    first.write_text(_line(f"{path.resolve()}:exits")[:30])
    assert zoo.load_cells(str(first)) == []


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--out", "{folder}"], "cannot write the results file (--out) {folder}: it is a directory"),
        (["--out", "{folder}/", "--resume"], "the trailing slash names a folder"),
        (["--out", "-"], "the results file cannot be stdout (-)"),
        (["--markdown", "{folder}"], "cannot write the Markdown page (--markdown) {folder}: it is a directory"),
        (["--markdown", "{notes}"], "cannot write the Markdown page (--markdown) {notes}: it holds something other "
                                    "than a zoo page"),
        (["--markdown", "{binary}"], "it holds something other than a zoo page"),
        (["--out", "{journal}", "--markdown", "{journal}", "--resume"], "are the same file"),
        (["--out", "{model}"], "the results file (--out) would be written over the model file {model}"),
        (["--markdown", "{listing}", "--models", "@{listing}"], "would be written over the model list {listing}"),
    ],
    ids=["out-folder", "out-slash", "out-stdout", "md-folder", "md-unrelated", "md-binary", "same-file",
         "out-model-file", "md-model-list"],
)
def test_outputs_are_checked_before_any_cell_runs(cli, fixture_backends, models, tmp_path, flags, says):
    path, log = models
    places = {"folder": tmp_path / "a-folder", "notes": tmp_path / "README.md", "binary": tmp_path / "b.md",
              "journal": tmp_path / "cells.jsonl", "model": path.resolve(), "listing": tmp_path / "models.txt"}
    places["folder"].mkdir()
    places["notes"].write_text("# My project\n\nNot a zoo page.\n")
    places["binary"].write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    places["journal"].write_text(_line(f"{path.resolve()}:exits"))
    places["listing"].write_text(f"{path}:exits\n")
    before = {p: p.read_bytes() for p in places.values() if p.is_file()}
    argv = [f.format(**places) for f in flags]
    if "--models" not in argv:
        argv += ["--models", f"{path}:exits"]
    code, out, err = cli("zoo", *argv, "--backends", fb.TABLE, "--schemes", "float")
    assert code == 2 and says.format(**places) in err, err
    assert len(err.strip().splitlines()) == 1, err  # one line
    assert not log.exists(), "a cell ran before the outputs were checked"
    assert {p: p.read_bytes() for p in before} == before


def test_markdown_over_a_zoo_page_is_rewritten(cli, fixture_backends, models, tmp_path, zoo):
    path, log = models
    journal, page = tmp_path / "cells.jsonl", tmp_path / "zoo.md"
    journal.write_text(_line(f"{path.resolve()}:exits"))
    page.write_text(zoo.render_page([], "edgeplug zoo (earlier)", 1, 0.0))
    code, out, err = cli("zoo", "--models", f"{path}:exits", "--backends", fb.TABLE, "--schemes", "float",
                         "--out", journal, "--resume", "--markdown", page, "--quiet")
    assert code == 0, err
    assert f"wrote {page}" in out and "build/export: recorded earlier" in page.read_text() and not log.exists()


def test_a_second_run_on_a_journal_being_written_is_refused(models, tmp_path):
    path, log = models
    out = tmp_path / "cells.jsonl"
    argv = ["--models", f"{path}:hangs", "--backends", fb.TABLE, "--schemes", "float", "--out", out, "--quiet"]
    first = subprocess.Popen([sys.executable, "-m", "edgeplug._cli", "zoo", *map(str, argv), "--timeout", "300"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    try:
        deadline = time.monotonic() + 180
        while "hangs" not in _starts(log):  # the first run holds the journal and runs its cell
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.2)
        for resume in (["--resume"], []):
            second = _zoo(*argv, *resume)
            assert second.returncode == 2, second.stderr
            assert f"{out} is being written by another zoo run: wait for it to end" in second.stderr
        assert _starts(log) == ["hangs"] and out.read_text() == ""
    finally:
        first.terminate()
        first.communicate(timeout=60)
    # the first run is over: its journal resumes (the hang, cut short by the stop, runs again, briefly)
    again = _zoo(*argv, "--resume", "--timeout", "3")
    assert again.returncode == 0 and "timeout" in again.stdout, again.stderr


def test_a_model_function_that_exits_is_its_own_cells_outcome(models, tmp_path, zoo):
    path, log = models
    out = tmp_path / "cells.jsonl"
    run = _zoo("--models", f"{path}:exits,{path}:dies", "--backends", fb.TABLE, "--schemes", "float",
               "--jobs", "2", "--out", out, "--quiet")
    assert run.returncode == 0, run.stderr
    cells = {c.label.split(" ")[0]: c for c in zoo.load_cells(str(out))}
    assert sorted(_starts(log)) == ["dies", "exits"]
    assert "called sys.exit(3)" in cells["exits"].error, cells["exits"]  # the model's own doing, named
    assert (cells["dies"].status, cells["dies"].detail) == ("crashed", "its process exited with code 7")
    assert "1 crashed, 1 failed" in run.stdout


# --------------------------------------------------------------------------- Ray: a run that cannot progress ends


def test_a_ray_cluster_that_can_never_run_a_cell_stops_at_once(models, tmp_path):
    pytest.importorskip("ray", reason="ray is not installed (pip install 'edgeplug[ray]')")
    path, log = models
    out = tmp_path / "cells.jsonl"
    start = time.monotonic()
    run = _zoo("--models", f"{path}:exits", "--backends", fb.TABLE, "--schemes", "float", "--executor", "ray",
               "--memory-limit", 100_000_000, "--timeout", 60, "--out", out, timeout=120)  # 100 TB
    took = time.monotonic() - start
    assert run.returncode == 2, run.stderr
    assert "Ray cluster (local) started in " in run.stderr  # its start time, reported
    assert ("edgeplug: error: the local Ray cluster can never run a cell: each cell asks 1 CPU and 100000000 MB "
            "of memory (--memory-limit)") in run.stderr and "lower --memory-limit" in run.stderr
    assert took < 60 and not log.exists() and out.read_text() == ""


def test_a_ray_address_that_does_not_answer_ends_within_the_timeout(models):
    pytest.importorskip("ray", reason="ray is not installed (pip install 'edgeplug[ray]')")
    path, log = models
    argv = ["--models", f"{path}:exits", "--backends", fb.TABLE, "--schemes", "float", "--executor", "ray"]
    with socket.socket() as closed:  # a port nothing listens on: refused at once
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    run = _zoo(*argv, "--address", f"127.0.0.1:{port}", "--timeout", 5)
    assert run.returncode == 2 and f"no Ray cluster answers at 127.0.0.1:{port}" in run.stderr, run.stderr
    with socket.socket() as silent:  # takes connections (the kernel does), never speaks: Ray would wait for ever
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        start = time.monotonic()
        run = _zoo(*argv, "--address", f"127.0.0.1:{port}", "--timeout", 5, timeout=120)
        took = time.monotonic() - start
    assert run.returncode == 2, run.stderr
    assert f"the Ray cluster at 127.0.0.1:{port} did not answer within 5 s (the cell timeout, --timeout)" in run.stderr
    assert took < 40 and not log.exists()  # 5 s, the command's start, and its exit


# -- model names: the zoo takes the registry's ------------------------------------------


def test_the_zoos_names_and_the_registrys_are_one_cell(cli, fixture_backends, tmp_path, zoo):
    """``transformers-llama`` is the zoo's ``llama``: the cell recorded as ``llama`` is the one it asks for
    (none runs), with no deprecation notice (the zoo keeps ``llama``)."""
    journal = tmp_path / "cells.jsonl"
    journal.write_text(_line("llama"))
    for name in ("transformers-llama", "llama", "LlamaForCausalLM"):
        code, out, err = cli("zoo", "--models", name, "--backends", fb.TABLE, "--schemes", "float",
                             "--out", journal, "--resume", "--quiet")
        assert code == 0, err
        assert "deprecated" not in err and "build/export: recorded earlier" in out, (name, out, err)
    assert journal.read_text() == _line("llama")


def test_an_unknown_zoo_model_fails_in_one_line_naming_the_names(cli, fixture_backends, tmp_path):
    code, out, err = cli("zoo", "--models", "transformers-lama", "--backends", fb.TABLE, "--schemes", "float")
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert "unknown model 'transformers-lama' (did you mean 'transformers-llama'?)" in err
    assert "llama, qwen3, gemma3" in err and "handwritten-llama-decoder, handwritten-gemma-block, handwritten-mlp" in err


def test_the_zoo_builds_another_registry_model_by_its_name(tmp_path, zoo):
    out = tmp_path / "cells.jsonl"
    run = _zoo("--models", "handwritten-mlp", "--backends", fb.TABLE, "--schemes", "float", "--out", out, "--quiet")
    assert run.returncode == 0, run.stderr
    (cell,) = zoo.load_cells(str(out))
    assert (cell.model, cell.label, cell.error) == ("handwritten-mlp", "handwritten-mlp", ""), cell
    assert cell.edgeplug.ok and cell.edgeplug.partitions == 1 and "handwritten-mlp" in run.stdout
