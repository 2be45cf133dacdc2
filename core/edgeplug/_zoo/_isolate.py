"""A cell in its own process, under a timeout and a memory limit: ``execute_cell``.

Both executors call ``execute_cell``; it starts a fresh Python (``python -m
edgeplug._zoo._isolate``) that sets its memory limit (``RLIMIT_DATA``) before it
imports anything, runs ``run_cell`` and writes the cell as JSON to a file. The
caller never sees an exception: a cell that ran past its timeout, ran out of
memory, crashed or whose process was killed comes back as a cell with that
``status`` and a ``detail`` saying what happened.

A process killed from outside (SIGKILL: the OOM killer, a preempted node,
someone's ``kill``) is started again, at most ``retries`` times, then recorded
as ``lost``; a process that crashes on its own (a signal it raised, a non-zero
exit) is recorded as ``crashed`` at once: running it again would crash again.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

#: in the environment of a cell's process: which executor started it ("local" or "ray")
EXECUTOR_ENV = "EDGEPLUG_ZOO_EXECUTOR"
_MEMORY_WORDS = ("can't allocate memory", "MemoryError", "std::bad_alloc", "out of memory")


def execute_cell(
    spec: dict,
    timeout: Optional[float] = None,
    memory_mb: Optional[int] = None,
    retries: int = 1,
    executor: str = "local",
    attempts_dir: Optional[str] = None,
) -> dict:
    """Run the cell ``spec`` (``run_cell``'s arguments as a dict) in a fresh process; the cell as a dict.

    ``attempts_dir``: a folder where each start of this cell is counted (a retried Ray task starts
    this function again; the count tells it how many starts came before)."""
    counter = _attempt_counter(spec, attempts_dir)
    while True:
        attempts = counter()
        result = _one_process(spec, timeout, memory_mb, executor)
        if result.get("status") == "lost" and attempts <= retries and not _STOPPING.is_set():
            continue
        result["attempts"] = attempts
        if result.get("status") == "lost":
            result["detail"] += f"; started {attempts} time{'s' if attempts > 1 else ''}"
        return result


def _attempt_counter(spec: dict, folder: Optional[str]):
    local = [0]
    if folder is None or not os.path.isdir(folder):
        def count() -> int:
            local[0] += 1
            return local[0]
        return count
    name = "-".join(str(spec.get(k, "")) for k in ("model", "backend", "scheme"))
    path = Path(folder) / (hashlib.sha1(name.encode()).hexdigest()[:16] + ".starts")  # no slashes from the model

    def count_file() -> int:
        with open(path, "a") as f:
            f.write("x")
        return path.stat().st_size

    return count_file


def _one_process(spec: dict, timeout: Optional[float], memory_mb: Optional[int], executor: str) -> dict:
    # torch (_record, _lowering): this module is also the cell's process, which sets its memory limit
    # before it imports anything
    from edgeplug._zoo._lowering import dry_run
    from edgeplug._zoo._record import Cell

    cell = Cell(model=spec["model"], backend=spec["backend"], scheme=spec.get("scheme", "float"))
    try:
        cell.dry_run = dry_run(spec["backend"])
    except Exception:
        pass
    with tempfile.TemporaryDirectory(prefix="edgeplug-zoo-") as tmp:
        out, log = os.path.join(tmp, "cell.json"), os.path.join(tmp, "cell.log")
        env = dict(os.environ)
        env[EXECUTOR_ENV] = executor
        env.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())  # wgpu only warns without it
        job = {"spec": spec, "out": out, "memory_mb": memory_mb}
        if _STOPPING.is_set():
            cell.status, cell.detail = "lost", "the run was stopped before this cell started"
            return cell.to_dict()
        start = time.perf_counter()
        status, usage, timed_out = _start_and_wait(job, log, env, timeout)
        cell.wall_seconds = round(time.perf_counter() - start, 3)
        cell.peak_mb = round(usage.ru_maxrss / 1024, 1) if usage is not None else None
        if timed_out:
            cell.status, cell.detail = "timeout", f"ran past its timeout of {timeout:g} s and was killed"
            return cell.to_dict()
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and os.path.exists(out):
            with open(out) as f:
                done = json.load(f)
            done["wall_seconds"], done["peak_mb"] = cell.wall_seconds, done.get("peak_mb") or cell.peak_mb
            return done
        cell.status, cell.detail = _why_it_ended(status, _tail(log), memory_mb, cell.peak_mb)
        return cell.to_dict()


def _start_and_wait(job: dict, log: str, env: dict, timeout: Optional[float]) -> tuple[int, Any, bool]:
    """The cell's process started on ``job`` (its output in ``log``) and waited for: ``_wait``'s answer."""
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "edgeplug._zoo._isolate"],
            stdin=subprocess.PIPE, stdout=log_file, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,  # a timeout ends its whole process group
        )
        _LIVE.add(proc)
        try:
            proc.stdin.write(json.dumps(job).encode())
            proc.stdin.close()
            return _wait(proc, timeout)
        finally:
            _LIVE.discard(proc)


def _why_it_ended(status: int, tail: str, memory_mb: Optional[int], peak_mb: Optional[float]) -> tuple[str, str]:
    """(status, detail) of a cell's process that wrote no cell: its memory limit, killed, or crashed."""
    near_limit = memory_mb is not None and peak_mb is not None and peak_mb >= 0.9 * memory_mb
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        if memory_mb is not None and (near_limit or any(w in tail for w in _MEMORY_WORDS)):
            return "memory", f"killed by {name} at its memory limit of {memory_mb} MB (peak {peak_mb} MB)"
        if sig == signal.SIGKILL:
            return "lost", "its process was killed (SIGKILL) mid-run"
        return "crashed", f"its process died of {name}" + (f": {tail}" if tail else "")
    code = os.WEXITSTATUS(status)
    if memory_mb is not None and any(w in tail for w in _MEMORY_WORDS):
        return "memory", f"exceeded its memory limit of {memory_mb} MB: {tail}"
    return "crashed", f"its process exited with code {code}" + (f": {tail}" if tail else "")


#: cell processes running now, so that an interrupted run ends them (``kill_live``)
_LIVE: set = set()
#: set while a run is being stopped: no cell process starts, none is started again
_STOPPING = threading.Event()


def kill_live() -> None:
    """End every cell process this process started and has not collected, and start no more until ``allow``."""
    _STOPPING.set()
    for proc in list(_LIVE):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass


def allow() -> None:
    """Cell processes may start again (a new run)."""
    _STOPPING.clear()


def _wait(proc: subprocess.Popen, timeout: Optional[float]) -> tuple[int, Any, bool]:
    """(wait status, resource usage, timed out) of ``proc``; past ``timeout`` its process group is killed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.02
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = status  # collected here: Popen must not wait for it again
            return status, usage, False
        if deadline is not None and time.monotonic() >= deadline:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = status
            return status, usage, True
        time.sleep(delay)
        delay = min(delay * 2, 0.25)


def _tail(log: str, limit: int = 300) -> str:
    """The last meaningful line of a cell process's output (its error, usually)."""
    try:
        lines = [ln.strip() for ln in Path(log).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:limit] if lines else ""


def _child() -> int:
    """The cell process: limits first, then the cell; the cell's JSON goes to the named file."""
    job = json.loads(sys.stdin.read())
    memory_mb = job.get("memory_mb")
    if memory_mb:
        limit = int(memory_mb) << 20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    _die_with_parent()
    spec = dict(job["spec"])
    threads = spec.pop("threads", None)
    # torch and the cell (which loads executorch): only now, under the memory limit set above
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    from edgeplug._zoo._cell import run_cell  # under the memory limit: as torch above

    cell = run_cell(**spec)
    if memory_mb and any(w in text for w in _MEMORY_WORDS for text in (cell.error, cell.edgeplug.error, cell.stock.error)):
        cell.status, cell.detail = "memory", f"exceeded its memory limit of {memory_mb} MB"
    cell.peak_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    tmp = job["out"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(cell.to_dict(), f)
    os.replace(tmp, job["out"])
    return 0


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the process that started it dies (a lost Ray worker)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    sys.exit(_child())
