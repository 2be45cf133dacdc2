"""ExecuTorch's backend test suite as a product (issue 45): ``python -m edgeplug.testing.executorch_suite --backend
NAME`` runs it for any installed backend, a third party's too, and says which tests stock's flow passes that
edgeplug does not."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edgeplug.testing.executorch_suite import FlowOutcome, SuiteRow, SuiteRun, run_command

pytest.importorskip("executorch.backends.test.suite")


def _run(rows: list[SuiteRow]) -> SuiteRun:
    return SuiteRun("somebackend", rows, lower_only=False, dry_run=False, stock="somebackend")


def _row(test: str, stock: str, ours: str, last: tuple[str, str] = ("delegated", "")) -> SuiteRow:
    return SuiteRow("test_op", test, {"stock": FlowOutcome(stock, [("delegated", "")]), "edgeplug": FlowOutcome(ours, [last])})


def test_lost_is_what_stock_passes_and_edgeplug_neither_passes_nor_refuses_up_front():
    run = _run([
        _row("test_same", "passed", "passed"),
        _row("test_refused", "passed", "refused", ("refused", "edgeplug refused it up front: ... Fix: ...")),
        _row("test_mismatch", "passed", "failed", ("OUTPUT_MISMATCH_FAIL", "AssertionError: outputs differ")),
        _row("test_lowering", "passed", "failed", ("LOWER_FAIL", "LoweringError: a pass broke it")),
        _row("test_both_skip", "skipped", "skipped", ("SKIPPED", "")),
        _row("test_stock_fails", "failed", "passed"),
    ])
    assert [r.test for r in run.lost()] == ["test_mismatch", "test_lowering"]
    assert [r.test for r in run.refused()] == ["test_refused"]
    table = run.table()
    assert "| tests passed / refused up front / skipped / failed | 4 / 0 / 1 / 1 | 2 / 1 / 1 / 2 |" in table
    assert "| cases lowered but mismatched (output differs from eager) | 0 | 1 |" in table
    assert "| cases failing at lowering | 0 | 1 |" in table
    assert "stock passes, edgeplug neither passes nor refuses up front: test_mismatch, test_lowering" in table
    assert "- test_lowering: stock passed, edgeplug failed (LOWER_FAIL: LoweringError: a pass broke it)" in table


def test_nothing_lost_when_every_difference_is_a_refusal():
    run = _run([_row("test_refused", "passed", "refused", ("refused", "edgeplug refused it up front"))])
    assert run.lost() == [] and "neither passes nor refuses up front: none" in run.table()


@pytest.mark.parametrize("args, message", [
    (["--backend", "no-such-backend"], "no-such-backend"),
    (["--backend", "fixture-table", "--ops", "no_such_op"], "no operator file test_no_such_op"),
])
def test_what_cannot_run_is_said_in_one_line_and_nothing_runs(fixture_backends, capsys, args, message):
    assert run_command(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.fixture(scope="module")
def third_party(tmp_path_factory):
    """A backend not shipped here: `edgeplug new-backend suitecheck`, installed into a folder of its own."""
    tmp = tmp_path_factory.mktemp("suite-third-party")
    env = {k: v for k, v in os.environ.items() if k not in ("EDGEPLUG_PLUGINS", "EDGEPLUG_DISABLE_PLUGINS")}
    proc = subprocess.run([sys.executable, "-m", "edgeplug._cli", "new-backend", "suitecheck", "-o", str(tmp)],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(tmp / "site"), str(tmp / "edgeplug-suitecheck")],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp, dict(env, PYTHONPATH=str(tmp / "site"))


def test_a_third_partys_backend_runs_the_suite_with_the_one_command(third_party):
    """The command docs/writing-a-backend.md gives, on a backend not shipped here: the suite has no stock flow for
    it, so edgeplug's flow runs alone, each case lowered, run in ExecuTorch's runtime and compared with eager."""
    tmp, env = third_party
    proc = subprocess.run(
        [sys.executable, "-m", "edgeplug.testing.executorch_suite", "--backend", "suitecheck",
         "--ops", "add,adaptive_maxpool2d", "--tests", "test_add_dtype,test_adaptive_maxpool2d_dtype",
         "--json", str(tmp / "suite.json")],
        cwd=tmp, env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "| suitecheck, 2 float32 operator tests, lowered, run in ExecuTorch's Python runtime and compared with eager | through edgeplug |" in out
    assert "| tests passed / refused up front / skipped / failed | 1 / 1 / 0 / 0 |" in out
    assert "| cases run and matching eager, delegated | 1 |" in out
    assert "edgeplug's flow only: ExecuTorch's backend test suite has no flow named 'suitecheck'" in out
    assert (tmp / "suite.json").stat().st_size > 0


def test_a_backend_that_cannot_serialize_here_is_lowered_as_a_dry_run_and_not_run(fixture_backends):
    from edgeplug.testing.executorch_suite import run_operator_tests

    run = run_operator_tests(fixture_backends.OFFLINE, ["add"], tests=["test_add_dtype"])
    assert (run.dry_run, run.lower_only, run.stock) == (True, True, None)
    [row] = run.rows
    assert row.flows["edgeplug"].outcome == "passed" and row.flows["edgeplug"].cases == [("lowered", "")]
    assert "dry run" in run.notes[0] and "cannot serialize here" in run.notes[0]
    assert "lowering only" in run.table() and "(dry run)" in run.table()


def test_an_interrupted_run_says_so_in_one_line_and_writes_no_json(monkeypatch, capsys, tmp_path):
    import edgeplug.testing.executorch_suite as suite

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(suite, "run_operator_tests", interrupted)
    out = tmp_path / "suite.json"
    assert suite.run_command(["--backend", "anything", "--json", str(out)]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and f"{out} not written" in err and "Traceback" not in err
    assert not out.exists()
