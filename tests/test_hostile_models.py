"""Hostile model files (issue 37): a model file is run as Python, and what it does to the process does not
reach the lowering. It may print thousands of lines, change the working folder, call sys.exit, leave a thread
running or return its inputs in the wrong shape: each ends in one clear ``edgeplug:`` line naming the model's
line, and the outputs land where they were checked. A model in training mode that drops out at random is
refused for --verify with the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import edgeplug
from edgeplug._registry import lookup as plugins

EDGEPLUG = [sys.executable, "-m", "edgeplug._cli"]
#: the backend the CLI cases lower to (tests/fixtures/backends); fixture-fused verifies on the host
BACKEND = "fixture-keep"
VERIFIES = "fixture-fused"

HOSTILE = '''
import os, sys, threading, torch

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)

CASE = os.environ.get("HOSTILE_CASE", "")
if CASE == "exit_at_import":
    sys.exit(3)
if CASE == "print_at_import":
    for i in range(20000):
        print("noise at import", i)
if CASE == "chdir_at_import":
    os.chdir("elsewhere")

def make():
    return Tiny().eval(), (torch.randn(1, 4),)

def exits():
    sys.exit("no model today")

def prints():
    for i in range(20000):
        print("noise", i, file=sys.stderr if i % 2 else sys.stdout)
    return Tiny().eval(), (torch.randn(1, 4),)

def prints_then_fails():
    for i in range(20000):
        print("noise", i)
    raise ValueError("checkpoint missing")

def changes_folder():
    os.chdir("elsewhere")
    return Tiny().eval(), (torch.randn(1, 4),)

def leaves_a_thread():
    threading.Thread(target=threading.Event().wait, name="stray").start()
    return Tiny().eval(), (torch.randn(1, 4),)

def generator():
    return Tiny().eval(), (torch.randn(1, 4) for _ in range(1))

def list_of_tuples():
    return Tiny().eval(), [(torch.randn(1, 4),), (torch.randn(1, 4),)]

def a_tuple_input():
    return Pair().eval(), ((torch.randn(1, 4), torch.randn(1, 4)),)

class Pair(torch.nn.Module):
    def forward(self, pair):
        return pair[0] + pair[1]

class Drops(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.fc(x))

def dropout_in_training():
    return Drops(), (torch.randn(8, 4),)

def dropout_in_eval():
    return Drops().eval(), (torch.randn(8, 4),)
'''


def _line(text: str) -> int:
    """The line of ``text`` in HOSTILE (1-based, as the file is written)."""
    return next(i for i, line in enumerate(HOSTILE.splitlines(), 1) if text in line)


@pytest.fixture(autouse=True)
def _clean(fixture_backends, clean_plugin_env, monkeypatch, tmp_path):
    monkeypatch.delenv("EDGEPLUG_DEBUG", raising=False)
    monkeypatch.delenv("HOSTILE_CASE", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    plugins.reset()
    yield
    plugins.reset()


def _model(tmp_path: Path, name: str) -> str:
    """The hostile file under its own name (each test imports a module of its own)."""
    (tmp_path / f"{name}.py").write_text(HOSTILE)
    return f"{name}.py"


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("edgeplug: error:")]


# -- sys.exit --------------------------------------------------------------------------------


def test_sys_exit_at_import_is_one_error_naming_its_line(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HOSTILE_CASE", "exit_at_import")
    model = _model(tmp_path, "exit_import")
    code, stdout, stderr = cli("lower", f"{model}:make", "-b", BACKEND, "-q")
    assert code == 2 and stdout == ""
    assert stderr.splitlines() == [
        f"edgeplug: error: importing {model} failed: it called sys.exit(3) at {model}:{_line('sys.exit(3)')}, "
        "in <module>; a model file must return (model, args), not exit"
    ]
    assert not list(tmp_path.glob("*.pte"))


def test_sys_exit_in_the_model_function_is_one_error_naming_its_line(cli, tmp_path):
    model = _model(tmp_path, "exit_call")
    code, stdout, stderr = cli("lower", f"{model}:exits", "-b", BACKEND, "-q")
    assert code == 2 and stdout == ""
    assert stderr.splitlines() == [
        f"edgeplug: error: calling {model}:exits failed: it called sys.exit('no model today') at "
        f"{model}:{_line('no model today')}, in exits; a model file must return (model, args), not exit"
    ]


# -- printing --------------------------------------------------------------------------------


def test_heavy_printing_is_held_off_the_terminal_and_counted(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HOSTILE_CASE", "print_at_import")
    model = _model(tmp_path, "prints")
    code, stdout, stderr = cli("lower", f"{model}:prints", "-b", BACKEND, "-o", "out.pte")
    assert code == 0, stderr
    assert "noise" not in stdout and "noise" not in stderr
    assert "the model file printed 40,000 lines, held off the terminal (-v shows them)" in stderr
    assert "wrote out.pte" in stdout
    assert (tmp_path / "out.pte").stat().st_size > 0


def test_with_v_the_models_prints_reach_the_terminal(cli, tmp_path):
    model = _model(tmp_path, "prints_v")
    code, stdout, stderr = cli("lower", f"{model}:prints", "-b", BACKEND, "-v", "-o", "out.pte")
    assert code == 0, stderr
    assert "noise 0\n" in stdout and "noise 19999\n" in stderr
    assert "held off the terminal" not in stderr


def test_a_model_that_prints_heavily_then_fails_ends_in_its_one_error(cli, tmp_path):
    model = _model(tmp_path, "prints_fail")
    code, stdout, stderr = cli("lower", f"{model}:prints_then_fails", "-b", BACKEND, "-q")
    assert code == 2 and stdout == ""
    assert stderr.splitlines() == [f"edgeplug: error: calling {model}:prints_then_fails failed: ValueError: checkpoint missing"]


def test_debug_shows_what_the_failing_model_printed(cli, tmp_path):
    model = _model(tmp_path, "prints_debug")
    code, _, stderr = cli("lower", f"{model}:prints_then_fails", "-b", BACKEND, "-q", "--debug")
    assert code == 2
    assert "the model file printed, while edgeplug held it off the terminal:" in stderr and "noise 19999" in stderr
    assert _errors(stderr) == [f"edgeplug: error: calling {model}:prints_then_fails failed: ValueError: checkpoint missing"]


def test_prints_do_not_reach_a_pte_streamed_to_stdout(tmp_path):
    model = _model(tmp_path, "prints_stdout")
    env = {**os.environ, "EDGEPLUG_REGISTER_PLUGINS": "edgeplug_fixture_backends", "HOSTILE_CASE": "print_at_import"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent / "fixtures" / "backends"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [*EDGEPLUG, "lower", f"{model}:prints", "-b", BACKEND, "-q", "-o", "-"],
        cwd=tmp_path, env=env, capture_output=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert b"noise" not in done.stdout and b"noise" not in done.stderr
    assert done.stdout[4:8] == b"ET12"  # the program's flatbuffer identifier: stdout is the .pte alone


# -- the working folder ----------------------------------------------------------------------


@pytest.mark.parametrize("where, attr", [("chdir_at_import", "make"), ("", "changes_folder")])
def test_a_changed_working_folder_is_undone_and_the_pte_lands_where_asked(cli, tmp_path, monkeypatch, where, attr):
    if where:
        monkeypatch.setenv("HOSTILE_CASE", where)
    model = _model(tmp_path, f"chdir_{attr}")
    code, stdout, stderr = cli("lower", f"{model}:{attr}", "-b", BACKEND, "-q", "-o", "out.pte", "--report", "out.json")
    assert code == 0, stderr
    assert Path.cwd() == tmp_path
    assert (tmp_path / "out.pte").is_file() and (tmp_path / "out.json").is_file()
    assert list((tmp_path / "elsewhere").iterdir()) == []
    lines = [i for i, text in enumerate(HOSTILE.splitlines(), 1) if 'os.chdir("elsewhere")' in text]
    line, func = (lines[0], "<module>") if where else (lines[1], attr)
    assert stderr.splitlines() == [
        f"edgeplug: warning: the model file changed the working folder to elsewhere at {model}:{line}, in {func}; "
        f"edgeplug went back to {tmp_path}, where the outputs are written (open files relative to the model "
        "file: os.path.dirname(__file__))"
    ]


# -- threads ---------------------------------------------------------------------------------


def test_a_thread_left_running_is_named_and_the_command_does_not_wait_for_it(tmp_path):
    model = _model(tmp_path, "thread")
    env = {**os.environ, "EDGEPLUG_REGISTER_PLUGINS": "edgeplug_fixture_backends"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent / "fixtures" / "backends"), env.get("PYTHONPATH", "")])
    # the thread waits forever: a command that waited for it would run into the timeout
    done = subprocess.run(
        [*EDGEPLUG, "lower", f"{model}:leaves_a_thread", "-b", BACKEND, "-q", "-o", "out.pte"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    line = _line('name="stray"')
    assert done.stderr.splitlines() == [
        f"edgeplug: warning: the model file started thread 'stray' at {model}:{line}, in "
        "leaves_a_thread and left it running; edgeplug does not wait for it when it ends (join it before "
        "returning, or start it with daemon=True)"
    ]
    assert "wrote out.pte" in done.stdout and (tmp_path / "out.pte").is_file()


# -- inputs of the wrong shape ---------------------------------------------------------------


def test_a_generator_of_inputs_is_refused_naming_the_line_and_the_shape(cli, tmp_path):
    model = _model(tmp_path, "gen")
    code, stdout, stderr = cli("lower", f"{model}:generator", "-b", BACKEND, "-q")
    assert code == 2 and stdout == ""
    assert stderr.splitlines() == [
        f"edgeplug: error: {model}:generator's return value (model, args, kwargs) at {model}:"
        f"{_line('for _ in range(1))')}: args must be a tuple of the model's positional inputs (or one tensor), "
        "not generator"
    ]


def test_a_list_of_input_tuples_is_refused_as_calibration_data(cli, tmp_path):
    model = _model(tmp_path, "sets")
    code, stdout, stderr = cli("lower", f"{model}:list_of_tuples", "-b", BACKEND, "-q")
    assert code == 2 and stdout == ""
    (line,) = stderr.splitlines()
    assert line.startswith(
        f"edgeplug: error: {model}:list_of_tuples's return value (model, args, kwargs) at {model}:"
        f"{_line('[(torch.randn(1, 4),), (torch.randn(1, 4),)]')}: args is a list of 2 tuple(s), a list of input sets"
    ), line
    assert "Return (model, (x,))" in line and "export" not in line  # refused before any work


def test_a_tuple_input_inside_the_args_tuple_still_lowers(cli, tmp_path):
    model = _model(tmp_path, "pair")
    code, _, stderr = cli("lower", f"{model}:a_tuple_input", "-b", BACKEND, "-q", "--dry-run")
    assert code == 0, stderr


# -- dropout in training mode ----------------------------------------------------------------


def test_train_mode_dropout_is_refused_for_verify_with_the_fix(cli, tmp_path):
    model = _model(tmp_path, "drops")
    code, stdout, stderr = cli("lower", f"{model}:dropout_in_training", "-b", VERIFIES, "-q", "--verify", "-o", "d.pte")
    assert code == 2 and stdout == ""
    (line,) = stderr.splitlines()
    assert line.startswith(
        "edgeplug: error: stage 'export': in the model: the model is in training mode and drops out at random: "
        f"Dropout 'drop' at {model}:{_line('return self.drop(self.fc(x))')}, in forward"
    ), line
    assert "Fix: call model.eval() before lowering" in line
    assert not (tmp_path / "d.pte").exists()


def test_the_same_model_in_eval_mode_verifies_and_has_no_random_op(cli, tmp_path):
    model = _model(tmp_path, "drops_eval")
    code, stdout, stderr = cli(
        "lower", f"{model}:dropout_in_eval", "-b", VERIFIES, "-q", "--verify", "-o", "d.pte", "--report", "d.json"
    )
    assert code == 0, stderr
    import json

    report = json.loads((tmp_path / "d.json").read_text())
    assert report["summary"]["verified"] is True
    ops = {*report["delegated_ops"], *report["cpu_ops"]}
    assert not any("dropout" in op for op in ops), ops


def test_lower_refuses_train_mode_dropout_for_verify_and_lowers_it_without():
    class Drops(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = torch.nn.Dropout(0.25)

        def forward(self, x):
            return torch.nn.functional.dropout(x, 0.1, training=self.training) + self.drop(x)

    args = (torch.randn(8, 4),)
    with pytest.raises(edgeplug.EdgeplugError, match=r"drops out at random: .*Fix: call model.eval\(\)"):
        edgeplug.lower(Drops(), args, VERIFIES, verify=True)
    # without verification nothing compares two draws: the program keeps its dropout, as the model asks
    result = edgeplug.lower(Drops(), args, VERIFIES)
    assert any("dropout" in op for op in {*result.report.cpu_ops, *result.report.delegated_ops})
    assert edgeplug.lower(Drops().eval(), args, VERIFIES, verify=True).report.verification.passed
