"""A runner that misbehaves cannot hang or flood edgeplug (issue 47). ``EDGEPLUG_VULKAN_RUNNER`` may point at
any program: one that never answers its greeting hung `lower --verify` (the battery killed it at 120 s), one
that writes a line without end was read until memory ran out, and SIGTERM or ^C while the greeting was awaited
left the runner running. Each answer now has a deadline (``EDGEPLUG_RUNNER_TIMEOUT`` replaces it), each line a
bound, and the runner ends with whatever stops the wait."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from edgeplug_vulkan_delegate.runtime import RunnerError, RunnerSession, find_runner

SILENT = "import time\ntime.sleep(600)\n"
FLOOD = "import sys\nwhile True:\n    sys.stdout.buffer.write(b'x' * 65536)\n"


def _runner(tmp_path, body: str):
    """An executable runner that writes its pid to ``pid`` beside it, then does ``body``."""
    path = tmp_path / "runner"
    path.write_text(
        f"#!{sys.executable}\nimport os\nopen({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\n{body}"
    )
    path.chmod(0o755)
    return path


def _gone(tmp_path) -> bool:
    pid = int((tmp_path / "pid").read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone too: it runs nothing
        return f.read().split(") ")[-1].startswith("Z")


@pytest.fixture
def runner_env(monkeypatch, tmp_path, edgeplug_plain_env):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGEPLUG_RUNNER_TIMEOUT", "2")

    def use(body: str):
        path = _runner(tmp_path, body)
        monkeypatch.setenv("EDGEPLUG_VULKAN_RUNNER", str(path))
        return path

    return use


def test_lower_verify_with_a_runner_that_never_greets_fails_at_the_deadline(edgeplug_cli, runner_env, tmp_path):
    runner_env(SILENT)
    start = time.monotonic()
    code, _, stderr = edgeplug_cli("lower", "mlp", "-b", "vulkan", "--verify", "-q", "-o", tmp_path / "m.pte")
    assert code == 2, stderr
    line = next(x for x in stderr.splitlines() if x.startswith("edgeplug: error:"))
    assert "did not answer its greeting (loading the program) within 2 s" in line
    assert "EDGEPLUG_RUNNER_TIMEOUT" in line and "bug" not in line
    assert not (tmp_path / "m.pte").exists() and _gone(tmp_path)
    assert time.monotonic() - start < 100


def test_a_runner_writing_without_end_is_stopped_at_the_bound(runner_env, tmp_path):
    runner_env(FLOOD)
    with pytest.raises(RunnerError, match="a line of more than 1 MiB without an end"):
        RunnerSession(b"not read", build=find_runner())
    assert _gone(tmp_path)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals reach the main thread")
def test_sigterm_while_the_greeting_is_awaited_ends_the_runner(runner_env, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEPLUG_RUNNER_TIMEOUT", "60")
    runner_env(SILENT)

    class Stop(BaseException):
        pass

    def stop(signum, frame):
        raise Stop

    previous = signal.signal(signal.SIGTERM, stop)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    try:
        timer.start()
        with pytest.raises(Stop):
            RunnerSession(b"not read", build=find_runner())
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, previous)
    assert _gone(tmp_path)
