"""Fault injection: plugins that raise, passes that corrupt weights, signals and races while writing.

Every case asserts the exit code, the first line of the message, that no
partial or stray file is left and no existing file changed, and that no
Python traceback reaches the user without --debug. Test plugins are
registered in-process (``edgeplug.register_plugin``); a subprocess is used
only where a signal must take its default course.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import edgeplug
import edgeplug_fixture_backends
from edgeplug._registry import lookup as plugins
from edgeplug.testing import assert_no_traceback, error_line, files_under
from edgeplug.testing.faults import CorruptWeight

PREVIOUS = b"the previous program"


#: the fixture backends the cases lower to: one with a support table, one whose programs verify here
BACKEND, VERIFYING = "fixture-table", "fixture-fused"


@pytest.fixture(autouse=True)
def _clean(clean_plugin_env, monkeypatch, tmp_path):
    import edgeplug_fixture_backends

    monkeypatch.delenv("EDGEPLUG_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    plugins.reset()
    with edgeplug_fixture_backends.registered():
        yield


# -- test plugins ---------------------------------------------------------------------


class FaultyBackend:
    """Registers backend "faulty" (fixture-table under another name); ``raise_in`` names the hook that raises."""

    def __init__(self, raise_in: str = "") -> None:
        self.raise_in = raise_in

    def _maybe(self, hook: str) -> None:
        if self.raise_in == hook:
            raise RuntimeError(f"vendor table for {hook} is missing")

    @edgeplug.hookimpl
    def edgeplug_backends(self):
        self._maybe("edgeplug_backends")
        yield edgeplug.BackendSpec(
            backend="faulty",
            description="fixture-table under another name, with faults on demand",
            backend_id=edgeplug_fixture_backends.BACKEND_IDS[BACKEND],
            partitioner=self.partitioner,
            availability=self.availability,
        )

    def availability(self):
        if self.raise_in == "availability":
            raise OSError("libvendor.so: cannot open shared object file")
        return edgeplug.Availability(ok=True)

    def partitioner(self):
        if self.raise_in == "partitioner":
            raise AttributeError("SM9999")  # as a vendor's factory does for a chip it does not know
        return edgeplug_fixture_backends.table_partitioner()

    @edgeplug.hookimpl
    def edgeplug_partitioner_filters(self):
        self._maybe("edgeplug_partitioner_filters")
        return []

    @edgeplug.hookimpl
    def edgeplug_fusion_policies(self):
        self._maybe("edgeplug_fusion_policies")
        return []

    @edgeplug.hookimpl
    def edgeplug_kernels(self):
        self._maybe("edgeplug_kernels")
        return []

    @edgeplug.hookimpl
    def edgeplug_passes(self):
        self._maybe("edgeplug_passes")
        return []


HOOKS = ["edgeplug_backends", "edgeplug_partitioner_filters", "edgeplug_fusion_policies", "edgeplug_kernels", "edgeplug_passes"]


# -- plugins that raise -----------------------------------------------------------------


@pytest.mark.parametrize("hook", HOOKS)
def test_a_plugin_whose_hook_raises_is_named_and_its_backend_refused(cli, edgeplug_register, tmp_path, hook):
    edgeplug_register(FaultyBackend(raise_in=hook), name="faulty-plugin")
    out = tmp_path / "m.pte"
    out.write_bytes(PREVIOUS)
    code, stdout, stderr = cli("lower", "mlp", "-b", "faulty", "-o", out)
    assert code == 2 and stdout == ""
    first = error_line(stderr)
    assert first.startswith("edgeplug: error: no backend named 'faulty'")
    assert "plugin 'faulty-plugin'" in first and hook in first
    assert f"RuntimeError: vendor table for {hook} is missing" in first
    assert out.read_bytes() == PREVIOUS and files_under(tmp_path) == ["m.pte"]
    assert_no_traceback(stderr)


def test_plugins_that_raise_do_not_stop_other_backends(cli, edgeplug_register, fixture_site, tmp_path):
    fixture_site("broken_import")  # fails at import
    for hook in HOOKS:
        edgeplug_register(FaultyBackend(raise_in=hook), name=f"faulty-{hook}")
    code, stdout, stderr = cli("lower", "mlp", "-b", BACKEND, "--dry-run", "-q")
    assert code == 0, stderr
    assert "partitions: 1" in stdout
    assert_no_traceback(stderr)


def test_a_plugin_that_fails_at_import_is_named_when_its_backend_is_asked_for(cli, fixture_site):
    fixture_site("broken_import")
    code, _, stderr = cli("lower", "mlp", "-b", "brokenimport")
    assert code == 2
    first = error_line(stderr)
    assert "no backend named 'brokenimport'" in first and "ModuleNotFoundError" in first
    assert "EDGEPLUG_DISABLE_PLUGINS" in first or "edgeplug-fixture-broken" in first
    assert_no_traceback(stderr)


def test_a_partitioner_factory_that_raises_names_the_stage_and_plugin(cli, edgeplug_register, tmp_path):
    edgeplug_register(FaultyBackend(raise_in="partitioner"), name="faulty-plugin")
    out = tmp_path / "m.pte"
    out.write_bytes(PREVIOUS)
    code, stdout, stderr = cli("lower", "mlp", "-b", "faulty", "-o", out, "--report", tmp_path / "r.json")
    assert code == 2 and stdout == ""
    first = error_line(stderr)
    # refused before any work: the factory is called before the model is built or exported
    assert first.startswith("edgeplug: error: the partitioner factory (BackendSpec.partitioner) of backend 'faulty'")
    assert "plugin 'faulty-plugin'" in first and "raised AttributeError: SM9999" in first
    assert "[faulty] export" not in stderr
    assert out.read_bytes() == PREVIOUS and files_under(tmp_path) == ["m.pte"]
    assert_no_traceback(stderr)


def test_an_availability_check_that_raises_names_the_plugin(cli, edgeplug_register, tmp_path):
    edgeplug_register(FaultyBackend(raise_in="availability"), name="faulty-plugin")
    code, stdout, stderr = cli("lower", "mlp", "-b", "faulty", "-o", tmp_path / "m.pte")
    assert code == 2 and stdout == ""
    first = error_line(stderr)
    assert first.startswith("edgeplug: error: backend 'faulty' cannot serialize its delegate here: its availability check")
    assert "plugin 'faulty-plugin'" in first and "OSError: libvendor.so: cannot open shared object file" in first
    assert files_under(tmp_path) == []
    assert_no_traceback(stderr)


def test_debug_shows_the_traceback_and_still_ends_in_one_error_line(cli, edgeplug_register, monkeypatch):
    edgeplug_register(FaultyBackend(raise_in="partitioner"), name="faulty-plugin")
    for flag in ("--debug", None):
        if flag is None:
            monkeypatch.setenv("EDGEPLUG_DEBUG", "1")
        code, _, stderr = cli("lower", "mlp", "-b", "faulty", "-q", *([flag] if flag else []))
        assert code == 2
        assert "Traceback (most recent call last)" in stderr and "AttributeError: SM9999" in stderr
        assert stderr.strip().splitlines()[-1].startswith("edgeplug: error: the partitioner factory")


def test_a_pass_that_raises_names_its_plugin(cli, edgeplug_register, tmp_path):
    class Raises:
        @edgeplug.hookimpl
        def edgeplug_passes(self):
            def boom(ep):
                raise KeyError("attention.wq")

            yield edgeplug.PassSpec(backend=BACKEND, stage="export", name="split-heads", fn=boom)

    edgeplug_register(Raises(), name="heads-plugin")
    code, stdout, stderr = cli("lower", "mlp", "-b", BACKEND, "-o", tmp_path / "m.pte")
    assert code == 2 and stdout == ""
    first = error_line(stderr)
    assert first.startswith(f"edgeplug: error: stage 'export passes': export-stage pass 'split-heads' of backend '{BACKEND}'")
    assert "plugin 'heads-plugin'" in first and "KeyError" in first
    assert files_under(tmp_path) == []
    assert_no_traceback(stderr)


def test_an_exported_program_whose_inputs_do_not_match_is_refused_before_any_work(cli, tmp_path):
    (tmp_path / "ep.py").write_text(
        textwrap.dedent(
            """
            import torch

            def make():
                ep = torch.export.export(torch.nn.Linear(8, 4), (torch.randn(2, 8),))
                return ep, (torch.randn(3, 5),)
            """
        )
    )
    code, stdout, stderr = cli("lower", f"{tmp_path / 'ep.py'}:make", "-b", BACKEND, "-o", tmp_path / "m.pte")
    assert code == 2 and stdout == ""
    first = error_line(stderr)
    # the input that does not match, named before any stage runs (it used to surface in the eager reference)
    assert first.startswith("edgeplug: error: edgeplug.lower: args[0] has size 3 at dimension 0, not 2"), first
    assert "Pass inputs of the dtypes and sizes it was exported with" in first
    assert "stage" not in first
    assert files_under(tmp_path) == ["ep.py"]
    assert_no_traceback(stderr)


def test_a_model_that_raises_in_forward_is_named_with_its_file_and_line(cli, tmp_path):
    (tmp_path / "boom.py").write_text(
        textwrap.dedent(
            """
            import torch

            class Boom(torch.nn.Module):
                def forward(self, x):
                    raise RuntimeError("boom in forward")

            def make():
                return Boom(), (torch.randn(2, 8),)
            """
        )
    )
    code, stdout, stderr = cli("lower", f"{tmp_path / 'boom.py'}:make", "-b", BACKEND, "-o", tmp_path / "m.pte")
    assert code == 2 and stdout == ""
    first = error_line(stderr)
    assert "failed in forward, " in first and f"{tmp_path / 'boom.py'}:6: RuntimeError: boom in forward" in first
    assert "The model raised there" in first
    assert files_under(tmp_path) == ["boom.py"]
    assert_no_traceback(stderr)


def test_a_model_file_without_a_function_says_to_name_one(cli, tmp_path):
    (tmp_path / "m.py").write_text("def make():\n    pass\n")
    code, _, stderr = cli("lower", str(tmp_path / "m.py"), "-b", BACKEND, "--dry-run")
    assert code == 2
    assert f"use {tmp_path / 'm.py'}:FUNCTION" in error_line(stderr)


# -- corrupted programs fail --verify (the CLI's exit 3 and report: the conformance suite's
# test_verification_fails_on_a_corrupted_weight, run for fixture-fused in tests/test_conformance.py) ----


def test_a_nan_weight_fails_verification_saying_nan(edgeplug_register):
    """The NaN message (the CLI's exit 3, report and no .pte: the conformance suite's scaled-weight case)."""
    from edgeplug.examples import load_model

    model, inputs, _, _ = load_model("mlp")
    edgeplug_register(CorruptWeight((VERIFYING,), "nan"), name="corrupter")
    check = edgeplug.lower(model, inputs, VERIFYING, verify=True).report.verification.outputs[0]
    assert not check.passed and "NaN where eager has none" in " | ".join(check.problems), check.problems


def test_nan_in_eager_at_the_same_positions_matches_and_hides_nothing(edgeplug_register):
    class NanAtZero(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            y = self.lin(x)
            return y * torch.where(torch.arange(8) == 0, torch.tensor(float("nan")), torch.tensor(1.0))

    torch.manual_seed(0)
    model, x = NanAtZero(), (torch.randn(2, 8),)
    good = edgeplug.lower(model, x, VERIFYING, verify=True)
    check = good.report.verification.outputs[0]
    assert check.passed and check.nonfinite_matched == 2 and check.max_abs_diff < 1e-4

    class Scale:
        @edgeplug.hookimpl
        def edgeplug_passes(self):
            def scale(ep):
                key = next(k for k in ep.state_dict if k.endswith("lin.weight"))
                ep.state_dict[key] = torch.nn.Parameter(ep.state_dict[key].detach() * 1.01, requires_grad=False)
                return ep

            yield edgeplug.PassSpec(backend=VERIFYING, stage="export", name="scale", fn=scale)

    edgeplug_register(Scale(), name="scale-plugin")
    bad = edgeplug.lower(model, x, VERIFYING, verify=True)
    check = bad.report.verification.outputs[0]
    assert not check.passed and check.nonfinite_matched == 2
    assert check.max_abs_diff > 1e-4 and "max |difference|" in check.problems[0]


def test_a_pass_that_writes_a_weight_in_place_is_stopped_at_that_pass(edgeplug_register):
    """The program shares the caller's weights (no copy: issue 27), so a pass that writes into one
    (here through ``.data``, which no version counter sees) is refused at that pass, by name, before
    anything is lowered or verified against a reference it changed."""
    from edgeplug.examples import load_model

    model, inputs, _, _ = load_model("mlp")
    edgeplug_register(CorruptWeight((VERIFYING,), "inplace"), name="inplace-plugin")
    with pytest.raises(edgeplug.PassError) as err:
        edgeplug.lower(model, inputs, VERIFYING, verify=True)
    message = str(err.value)
    assert "'corrupt-inplace'" in message and "inplace-plugin" in message
    assert "fc1.weight" in message and "in place" in message and "new tensor" in message


def test_a_pass_that_replaces_a_weight_leaves_the_callers_model_as_it_was(edgeplug_register):
    from edgeplug.examples import load_model

    model, inputs, _, _ = load_model("mlp")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    edgeplug_register(CorruptWeight((VERIFYING,), "scale"), name="replace-plugin")
    result = edgeplug.lower(model, inputs, VERIFYING, verify=True)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not result.report.verification.passed  # the reference is the caller's model, unchanged


# -- output paths, before any work ------------------------------------------------------------


def test_the_same_path_for_pte_and_report_is_refused_before_any_work(cli, tmp_path):
    same = tmp_path / "same.pte"
    same.write_bytes(PREVIOUS)
    code, stdout, stderr = cli("lower", "mlp", "-b", BACKEND, "-o", same, "--report", same)
    assert code == 2 and stdout == ""
    assert error_line(stderr) == (
        f"edgeplug: error: the .pte and the report are the same file ({same}): the second would replace the first; "
        "give them different paths"
    )
    assert f"[{BACKEND}] export" not in stderr  # refused before any work
    assert same.read_bytes() == PREVIOUS and files_under(tmp_path) == ["same.pte"]


@pytest.mark.parametrize("which", ["-o", "--report"])
@pytest.mark.parametrize("problem", ["directory", "file-as-folder", "read-only"])
def test_unwritable_targets_are_refused_before_any_work(cli, tmp_path, which, problem):
    if problem == "directory":
        target = tmp_path / "out"
        target.mkdir()
        expect = "it is a directory"
    elif problem == "file-as-folder":
        (tmp_path / "file").write_text("x")
        target = tmp_path / "file" / "sub" / "m.out"
        expect = "is a file, not a folder"
    else:
        target = Path("/proc/edgeplug-test/m.out")  # not writable, whoever runs the test
        expect = "is not writable"
    code, stdout, stderr = cli("lower", "mlp", "-b", BACKEND, which, target)
    assert code == 2 and stdout == ""
    first = error_line(stderr)
    assert f"cannot write the {'.pte' if which == '-o' else 'report'} {target}: " in first and expect in first
    assert f"[{BACKEND}] export" not in stderr
    assert [p for p in files_under(tmp_path) if p != "file"] == []
    assert_no_traceback(stderr)


# -- modes ----------------------------------------------------------------------------------


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_new_files_follow_the_umask_and_overwritten_files_keep_their_mode(umask_022, tmp_path):
    from edgeplug._outputs import write_files

    new, kept = tmp_path / "new.pte", tmp_path / "kept.json"
    kept.write_text("old")
    os.chmod(kept, 0o640)
    write_files({new: b"program", kept: "{}"})
    assert stat.S_IMODE(new.stat().st_mode) == 0o644
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640 and kept.read_text() == "{}"
    assert files_under(tmp_path) == ["kept.json", "new.pte"]


def test_the_cli_writes_pte_and_report_with_the_umasks_mode(cli, umask_022, tmp_path):
    out, rep = tmp_path / "m.pte", tmp_path / "m.json"
    code, _, stderr = cli("lower", "mlp", "-b", BACKEND, "-o", out, "--report", rep, "-q")
    assert code == 0, stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o644 and stat.S_IMODE(rep.stat().st_mode) == 0o644


# -- write failures, signals, races ------------------------------------------------------------


def test_a_report_that_cannot_be_written_leaves_the_pte_unwritten_too(cli, tmp_path, monkeypatch):
    out, rep = tmp_path / "m.pte", tmp_path / "m.json"
    out.write_bytes(PREVIOUS)
    calls = []
    real = os.fsync

    def second_fails(fd):
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(fd)

    monkeypatch.setattr(os, "fsync", second_fails)
    code, _, stderr = cli("lower", "mlp", "-b", BACKEND, "-o", out, "--report", rep, "-q")
    assert code == 74  # a full disk is the environment's: the README's 74 (issue 47)
    assert error_line(stderr).endswith("No space left on device; nothing was written")
    assert out.read_bytes() == PREVIOUS and files_under(tmp_path) == ["m.pte"]


@pytest.fixture
def signal_not_ignored():
    """As in a fresh ``edgeplug`` process: the signal has its default handler (a library an
    earlier test loaded into this process may have set SIGINT to SIG_IGN, which the writer
    respects); the handler it had is restored afterwards."""
    changed = {}

    def reset(signum):
        changed.setdefault(signum, signal.getsignal(signum))
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)

    yield reset
    for signum, handler in changed.items():
        if handler is not None:
            signal.signal(signum, handler)


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_while_writing_removes_the_temporaries(cli, tmp_path, monkeypatch, signal_not_ignored, signum, code):
    out, rep = tmp_path / "m.pte", tmp_path / "m.json"
    out.write_bytes(PREVIOUS)
    signal_not_ignored(signum)
    # the data is written whole to the temporary, then the signal arrives (as `timeout` sends it)
    monkeypatch.setattr(os, "fsync", lambda fd: signal.raise_signal(signum))
    got, _, stderr = cli("lower", "mlp", "-b", BACKEND, "-o", out, "--report", rep, "-q")
    assert got == code
    assert error_line(stderr) in (
        "edgeplug: error: terminated (SIGTERM); nothing was written",
        "edgeplug: error: interrupted; nothing was written",
    )
    assert out.read_bytes() == PREVIOUS and files_under(tmp_path) == ["m.pte"]
    assert_no_traceback(stderr)


def test_sigterm_with_the_default_handler_still_removes_the_temporary(tmp_path):
    # library use (no CLI handler): the temporary goes, then the signal kills the process as usual
    code = textwrap.dedent(
        f"""
        import os, signal
        from edgeplug._outputs import write_file
        os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGTERM)
        write_file({str(tmp_path / 'big.pte')!r}, b"x" * (8 << 20))
        print("not reached")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert "not reached" not in proc.stdout
    assert files_under(tmp_path) == []


def test_concurrent_writers_leave_one_whole_file_and_no_temporaries(tmp_path):
    from edgeplug._outputs import write_file

    target = tmp_path / "m.pte"
    payloads = [bytes([i]) * (2 << 20) for i in range(6)]
    errors = []

    def write(data):
        try:
            for _ in range(3):
                write_file(target, data)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert target.read_bytes() in payloads
    assert files_under(tmp_path) == ["m.pte"]


def test_concurrent_processes_writing_one_path(tmp_path):
    target = tmp_path / "m.pte"
    code = "import sys; from edgeplug._outputs import write_file\nfor _ in range(5): write_file(sys.argv[1], sys.argv[2].encode() * (1 << 20))"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(target), c]) for c in "ab"]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert target.read_bytes() in (b"a" * (1 << 20), b"b" * (1 << 20))
    assert files_under(tmp_path) == ["m.pte"]
