"""``edgeplug._zoo.run``: every cell of models x backends x schemes, on local processes or a Ray cluster.

Each finished cell is appended to the results file as one JSON line (one
``write`` of the whole line under an exclusive lock, then ``fsync``), so a run
that stops, for any reason, keeps every cell it finished; ``resume=True`` reads
that file and runs only the cells it lacks.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from edgeplug._registry.lookup import backends as installed_backends
from edgeplug._errors import EdgeplugError
from edgeplug._failures import first_line
from edgeplug._outputs import STDOUT, check_output_paths
from edgeplug._zoo._cell import schemes_of
from edgeplug._zoo._lowering import dry_run
from edgeplug._zoo._models import resolve_models
from edgeplug._zoo._record import FLOAT, Cell, cell_from_json
from edgeplug._zoo._isolate import allow, execute_cell, kill_live

EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class Settings:
    """What every cell of a run shares; a results file resumes only under the same settings."""

    layers: Optional[int] = None
    compare_stock: bool = False
    repeat: int = 1

    def as_dict(self) -> dict:
        return {"layers": self.layers, "compare_stock": self.compare_stock, "repeat": self.repeat}


def plan(
    models: Sequence[str] | str | None = None,
    backends: Sequence[str] | str | None = None,
    schemes: Sequence[str] | str | None = None,
) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(cells as (model, backend, scheme), notes on what was left out), model-major.

    ``backends``: default every installed one. ``schemes``: default float and each backend's
    own schemes; a scheme no chosen backend declares is an error, one only some declare makes
    cells for those. ``SCHEME@OWNER`` quantizes with backend OWNER's scheme and lowers for each chosen
    backend that declares no SCHEME of its own (a scheme a backend does not offer, tried on both sides)."""
    keys = resolve_models(_split(models) if models is not None else None)
    installed = list(installed_backends())
    chosen = _split(backends) if backends is not None else installed
    unknown = [b for b in chosen if b not in installed]
    if unknown:
        raise EdgeplugError(
            f"backend(s) {', '.join(unknown)} not installed; installed: {', '.join(installed)} "
            "(`edgeplug backends` lists them, `pip install edgeplug-NAME` adds one)"
        )
    declared = {b: schemes_of(b) for b in chosen}
    wanted = _split(schemes) if schemes is not None else None
    notes: list[str] = []
    borrowed = [s for s in wanted or [] if "@" in s]  # SCHEME@OWNER: another backend's scheme, lowered here
    for spec in borrowed:
        scheme, _, owner = spec.partition("@")
        if owner not in installed or scheme not in schemes_of(owner):
            known = ", ".join(schemes_of(owner)) if owner in installed else f"installed: {', '.join(installed)}"
            raise EdgeplugError(f"scheme {spec!r}: backend {owner!r} declares no scheme {scheme!r} ({known})")
    wanted = [s for s in wanted if "@" not in s] if wanted is not None else None
    if wanted is not None:
        nowhere = [s for s in wanted if s != FLOAT and not any(s in d for d in declared.values())]
        if nowhere:
            known = "; ".join(f"{b}: {', '.join([FLOAT, *d])}" for b, d in declared.items())
            raise EdgeplugError(f"scheme(s) {', '.join(nowhere)} declared by none of the chosen backends ({known})")
    cells: list[tuple[str, str, str]] = []
    for model in keys:
        for backend in chosen:
            for scheme in [FLOAT, *declared[backend]]:
                if wanted is not None and scheme not in wanted:
                    continue
                cells.append((model, backend, scheme))
            for spec in borrowed:  # where the backend declares no scheme of that name
                scheme, _, owner = spec.partition("@")
                if backend != owner and scheme not in declared[backend]:
                    cells.append((model, backend, spec))
    if wanted is not None:
        for backend in chosen:
            missing = [s for s in wanted if s != FLOAT and s not in declared[backend]]
            if missing:
                notes.append(f"{backend} declares no {', '.join(missing)}: those cells are not made")
    return cells, notes


def _split(value: Sequence[str] | str) -> list[str]:
    items = [value] if isinstance(value, str) else list(value)
    return [p.strip() for item in items for p in item.split(",") if p.strip()]


class Results:
    """The JSON lines file: cells recorded so far, and an atomic append of one more.

    The run holds an exclusive lock on the file from before it reads it until it ends: a second run on
    the same file is refused at once (``flock``; on the same host, or a file system that shares locks)."""

    def __init__(self, path: Optional[str], resume: bool, settings: Settings,
                 warn: Optional[Callable[[str], None]] = None) -> None:
        self.path = path
        self.recorded: dict[tuple[str, str, str], Cell] = {}
        self._fd: Optional[int] = None
        if path is None:
            return
        exists = os.path.isfile(path) and os.path.getsize(path) > 0
        if exists and not resume:
            raise EdgeplugError(
                f"{path} already holds results: pass --resume (resume=True) to run only the cells it lacks, "
                "or name another file"
            )
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            _lock(fd, path)
            if exists:
                self.recorded, problems = _read_journal(path, settings)
                if problems:
                    (warn or (lambda line: None))(_skipped(path, problems))
                if not _ends_with_newline(path):
                    os.write(fd, b"\n")  # a line cut short by a crash stays alone on its line, unread
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def append(self, cell: Cell, settings: Settings) -> None:
        if self._fd is None:
            return
        line = (json.dumps({**cell.to_dict(), "settings": settings.as_dict()}, sort_keys=True) + "\n").encode()
        view = memoryview(line)  # O_APPEND: each write lands at the end, whatever else appends
        while view:
            view = view[os.write(self._fd, view):]
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # and the lock with it
            self._fd = None


def _lock(fd: int, path: str) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise EdgeplugError(
            f"{path} is being written by another zoo run: wait for it to end (then add --resume), "
            "or name another file"
        ) from None
    except OSError:
        pass  # a file system without locks: each line is still one append of the whole line


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


#: at most this many skipped lines are named one by one
_NAMED = 5


def _skipped(path: str, problems: list[tuple[int, str]]) -> str:
    named = "; ".join(f"line {n}: {why}" for n, why in problems[:_NAMED])
    more = f"; and {len(problems) - _NAMED} more" if len(problems) > _NAMED else ""
    lines = f"{len(problems)} line{'s' if len(problems) > 1 else ''}"
    return (f"{path}: skipped {lines} that hold no cell ({named}{more}); they stay in the file, "
            "and the cells they were meant to hold run again")


def _read_journal(path: str, settings: Optional[Settings]) -> tuple[dict[tuple[str, str, str], Cell], list[tuple[int, str]]]:
    """(cells by key, (line number, why) of each line that holds no cell); the last line of a cell wins.

    Refuses a file none of whose lines is a cell or one cut short (not a results file), and a cell
    recorded under other settings."""
    cells: dict[tuple[str, str, str], Cell] = {}
    problems: list[tuple[int, str]] = []
    looks_like_results = False
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            line = raw.decode("utf-8", errors="replace")
            if not line.strip():
                continue
            cut = not raw.endswith(b"\n")
            try:
                data = json.loads(line)
            except ValueError:
                problems.append((number, "cut short (a run stopped while writing it)" if cut else "not JSON"))
                looks_like_results |= line.startswith('{"')
                continue
            try:
                cell = cell_from_json(data)
                recorded = data.get("settings")
                if recorded is not None and not isinstance(recorded, dict):
                    raise ValueError(f"'settings' is a {type(recorded).__name__}, not an object")
            except ValueError as exc:
                problems.append((number, f"not a cell: {exc}"))
                continue
            looks_like_results = True
            if settings is not None and recorded is not None and recorded != settings.as_dict():
                raise EdgeplugError(
                    f"{path}:{number} was recorded with {recorded}, this run has {settings.as_dict()}: "
                    "resume with the same settings, or write the results to another file"
                )
            cells[cell.key] = cell
    if problems and not looks_like_results:
        raise EdgeplugError(
            f"{path} is not a zoo results file (line {problems[0][0]}: {problems[0][1]}, and no line holds a cell): "
            "--out names the JSON-lines file a zoo run writes; name another file, and nothing is written to this one"
        )
    return cells, problems


def load_cells(path: str) -> list[Cell]:
    """The cells a results file holds (the last line of each cell wins; a line that holds none is skipped)."""
    return list(_read_journal(path, None)[0].values())


def run(
    models: Sequence[str] | str | None = None,
    backends: Sequence[str] | str | None = None,
    schemes: Sequence[str] | str | None = None,
    *,
    compare_stock: bool = False,
    jobs: int = 1,
    executor: str = "local",
    address: Optional[str] = None,
    timeout: Optional[float] = 600.0,
    memory_limit: Optional[int] = None,
    retries: int = 2,
    out: Optional[str] = None,
    resume: bool = False,
    layers: Optional[int] = None,
    repeat: int = 1,
    progress: Optional[Callable[[str], None]] = None,
    warn: Optional[Callable[[str], None]] = None,
) -> list[Cell]:
    """Run the zoo: each cell (model x backend x scheme) lowered, verified where it can be, timed,
    in its own process; the cells, in plan order (recorded ones from ``out`` included).

    ``timeout`` (seconds) and ``memory_limit`` (MB) hold per cell process; a cell past either is
    recorded as ``timeout`` or ``memory``. A cell whose process is killed is started again at
    most ``retries`` times (under Ray: its task's ``max_retries``), then recorded as ``lost``.
    ``out``: the JSON lines file; ``resume``: run only the cells it lacks. ``executor``: ``local``
    (``jobs`` processes at a time) or ``ray`` (a task per cell; a local cluster of ``jobs`` CPUs,
    or the cluster at ``address``). ``progress`` gets a line per finished cell; ``warn`` (default:
    ``progress``) a line for what the caller must see: lines of ``out`` skipped as no cell, a Ray
    cluster that cannot run a cell yet."""
    _check_run(executor, jobs, address, timeout, memory_limit, out)
    settings = Settings(layers=layers, compare_stock=compare_stock, repeat=repeat)
    cells, notes = plan(models, backends, schemes)
    say = progress or (lambda line: None)
    alert = warn or say
    for note in notes:
        say(note)
    results = Results(out, resume, settings, alert)
    allow()
    try:
        done = {k: c for k, c in results.recorded.items() if k in set(cells)}
        todo = [k for k in cells if k not in done]
        if done:
            say(f"resuming {out}: {len(done)} of {len(cells)} cells recorded, {len(todo)} to run")
        threads = max(1, (os.cpu_count() or 1) // jobs) if executor == "local" else 1
        specs = [
            {"model": m, "backend": b, "scheme": s, "layers": layers, "compare_stock": compare_stock,
             "repeat": repeat, "threads": threads}
            for m, b, s in todo
        ]
        start, total, finished = time.monotonic(), len(cells), len(done)
        with tempfile.TemporaryDirectory(prefix="edgeplug-zoo-attempts-") as attempts_dir:
            if executor == "local":
                stream = _local(specs, jobs, timeout, memory_limit, retries, attempts_dir)
            else:
                stream = _ray(specs, jobs, timeout, memory_limit, retries, attempts_dir, address, say, alert)
            for cell in stream:
                results.append(cell, settings)
                done[cell.key] = cell
                finished += 1
                say(_progress_line(cell, finished, total, len(todo), finished - (total - len(todo)), start))
    finally:
        kill_live()
        results.close()
    return [done[k] for k in cells if k in done]


def _check_run(
    executor: str, jobs: int, address: Optional[str], timeout: Optional[float], memory_limit: Optional[int], out: Optional[str],
) -> None:
    """``run``'s options, refused before any cell runs."""
    if executor not in EXECUTORS:
        raise EdgeplugError(f"unknown executor {executor!r}: use one of {', '.join(EXECUTORS)}")
    if jobs < 1:
        raise EdgeplugError(f"jobs must be at least 1, not {jobs}")
    if address and executor != "ray":
        raise EdgeplugError("an address is for --executor ray")
    for name, value in (("timeout", timeout), ("memory_limit", memory_limit)):
        if value is not None and value <= 0:
            raise EdgeplugError(f"{name} must be positive, not {value}")
    if out is not None:
        if os.fspath(out) == STDOUT:
            raise EdgeplugError("the results file cannot be stdout (-): --resume reads it back; name a file")
        check_output_paths({"the results file": out})


def _local(specs, jobs, timeout, memory_mb, retries, attempts_dir) -> Iterator[Cell]:
    """Each cell in a fresh process, ``jobs`` at a time (a thread per running cell waits on it)."""
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="edgeplug-zoo") as pool:
        futures = [
            pool.submit(execute_cell, spec, timeout, memory_mb, retries, "local", attempts_dir) for spec in specs
        ]
        try:
            for future in as_completed(futures):
                yield Cell.from_dict(future.result())
        finally:
            for future in futures:
                future.cancel()
            kill_live()


def _ray(specs, jobs, timeout, memory_mb, retries, attempts_dir, address, say, warn) -> Iterator[Cell]:
    """Each cell a Ray task running ``execute_cell``: 1 CPU, ``memory_mb`` of memory, ``retries`` retries.

    Never waits without a bound (with a ``timeout``): the cluster gets ``timeout`` seconds to start
    (or answer, at ``address``); a local cluster that no cell can run on is refused at once; a run in
    which no cell starts within ``timeout`` (a local cluster), or none finishes within
    ``(retries + 2) * timeout`` (any cluster), stops with a line saying so."""
    try:
        import ray  # an optional dependency (edgeplug[ray]), for --executor ray only
    except ImportError as exc:
        raise EdgeplugError(
            f"--executor ray needs ray ({exc}): pip install 'edgeplug[ray]'"
        ) from None
    started_here = not ray.is_initialized()
    cluster = _Cluster(ray, address, jobs, timeout) if started_here else None
    try:
        if cluster is not None:
            cluster.start()
        resources = _resources(ray)
        where = f"at {address}" if address else "(local)"
        start_text = f" in {cluster.seconds:.1f} s" if cluster is not None else ""
        say(f"Ray cluster {where} {'started' if not address else 'joined'}{start_text}: {resources}")
        unfit = _unschedulable(ray, memory_mb)
        if unfit and (cluster is not None and not address):
            raise EdgeplugError(f"the local Ray cluster can never run a cell: {unfit}")
        if unfit:
            warn(f"the Ray cluster {where} cannot run a cell now: {unfit}; the run waits for it to grow, "
                 "then stops if no cell finishes")
        task = ray.remote(execute_cell)
        options = {"num_cpus": 1, "max_retries": retries, "retry_exceptions": False}
        if memory_mb:
            options["memory"] = int(memory_mb) << 20
        pending = {
            # the limits are the local executor's: the cell's own process holds them, not the Ray worker
            task.options(**options).remote(spec, timeout, memory_mb, retries, "ray", attempts_dir): spec
            for spec in specs
        }
        submitted = last = time.monotonic()
        # starts are counted in attempts_dir: seen here when the workers share this host's files
        starts_visible = cluster is not None and not address
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=None if timeout is None else 2.0)
                now = time.monotonic()
                if not ready and timeout is not None:
                    why = _stalled(now, submitted, last, timeout, retries, starts_visible, attempts_dir)
                    if why:
                        raise EdgeplugError(
                            f"the Ray cluster {where} makes no progress: {why}; {len(pending)} of {len(specs)} "
                            f"cells waiting; it started{start_text}, and has {_resources(ray)}; each cell asks "
                            f"{_ask(memory_mb)}. The cells finished so far are kept: add --resume after fixing "
                            "the cluster, or run with --executor local"
                        )
                for ref in ready:
                    last = now
                    spec = pending.pop(ref)
                    try:
                        yield Cell.from_dict(ray.get(ref))
                    except ray.exceptions.RayError as exc:
                        yield _lost(spec, exc, retries)
        finally:
            for ref in pending:  # a stopped run leaves nothing running on the cluster
                ray.cancel(ref, force=True)
    finally:
        if cluster is not None:
            cluster.stop()


def _stalled(
    now: float, submitted: float, last: float, timeout: float, retries: int, starts_visible: bool, attempts_dir: str,
) -> Optional[str]:
    """Why a Ray run makes no progress (no cell started, or none finished, for longer than a cell can take), or None."""
    started = any(Path(attempts_dir).glob("*.starts"))
    if starts_visible and not started and now - submitted > timeout:
        return f"no cell started within {timeout:g} s (the cell timeout) of being submitted"
    if now - last > (retries + 2) * timeout:
        return (f"no cell finished in {now - last:.0f} s, longer than a cell can take "
                f"({retries} retr{'y' if retries == 1 else 'ies'} of {timeout:g} s, and as long again to start)")
    return None


class _Cluster:
    """``ray.init`` under a deadline. It runs in a thread that stays alive until ``stop``: the processes
    Ray starts die with the thread that started them (their parent-death signal)."""

    def __init__(self, ray, address: Optional[str], jobs: int, timeout: Optional[float]) -> None:
        self.ray, self.address, self.jobs, self.timeout = ray, address, jobs, timeout
        self.seconds = 0.0
        self._up, self._release = threading.Event(), threading.Event()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._init, name="edgeplug-zoo-ray", daemon=True)

    def _init(self) -> None:
        # Ray's SIGTERM handler is for a main thread; the run's own handler (the CLI's) stays in place
        logging.getLogger("ray._private.worker").addFilter(lambda r: "SIGTERM handler is not set" not in r.getMessage())
        try:
            if self.address:
                self.ray.init(address=self.address, log_to_driver=False)
            else:
                self.ray.init(num_cpus=self.jobs, include_dashboard=False, log_to_driver=False)
        except BaseException as exc:  # given to the run's thread, which raises it
            self._error = exc
        self._up.set()
        self._release.wait()

    def start(self) -> None:
        where = f"at {self.address}" if self.address else f"(local, {self.jobs} CPUs)"
        if self.address:
            _answers(self.address, self.timeout)
        begin = time.monotonic()
        self._thread.start()
        if not self._up.wait(self.timeout):
            raise EdgeplugError(
                f"the Ray cluster {where} did not {'answer' if self.address else 'start'} within {self.timeout:g} s "
                "(the cell timeout, --timeout): check the cluster (`ray status`), or run with --executor local"
            )
        self.seconds = time.monotonic() - begin
        if self._error is not None:
            raise EdgeplugError(
                f"the Ray cluster {where} did not start: {first_line(self._error)}; check the cluster "
                "(`ray status`), or run with --executor local"
            ) from self._error

    def stop(self) -> None:
        if self._up.is_set() and self._error is None:
            self.ray.shutdown()
        self._release.set()


def _answers(address: str, timeout: Optional[float]) -> None:
    """Refuse at once an ``address`` (HOST:PORT) where nothing listens; other forms are Ray's to resolve."""
    text = address.removeprefix("ray://")
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=min(timeout or 10.0, 10.0)).close()
    except OSError as exc:
        raise EdgeplugError(
            f"no Ray cluster answers at {address} ({exc.strerror or exc}): start one there (`ray start --head`), "
            "or leave out --address for a local cluster of --jobs CPUs"
        ) from None


def _ask(memory_mb: Optional[int]) -> str:
    return "1 CPU" + (f" and {memory_mb} MB of memory (--memory-limit)" if memory_mb else "")


def _resources(ray) -> str:
    try:
        total = ray.cluster_resources()
    except Exception:
        return "resources unknown"
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    return (f"{nodes} node{'s' if nodes != 1 else ''}, {total.get('CPU', 0):g} CPUs, "
            f"{total.get('memory', 0) / (1 << 20):.0f} MB of memory")


def _unschedulable(ray, memory_mb: Optional[int]) -> str:
    """Why no live node can take a cell's task (1 CPU, ``memory_mb``), or "" when one can."""
    try:
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    except Exception:
        return ""
    need = (int(memory_mb) << 20) if memory_mb else 0
    if any(r.get("CPU", 0) >= 1 and r.get("memory", 0) >= need for r in nodes):
        return ""
    if not nodes:
        return "it has no live node"
    cpus = max(r.get("CPU", 0) for r in nodes)
    memory = max(r.get("memory", 0) for r in nodes) / (1 << 20)
    fix = "lower --memory-limit" if memory_mb and memory * (1 << 20) < need else "give the cluster CPUs"
    return f"each cell asks {_ask(memory_mb)}, and its largest node has {cpus:g} CPUs and {memory:.0f} MB: {fix}"


def _lost(spec: dict, exc: BaseException, retries: int) -> Cell:
    cell = Cell(model=spec["model"], backend=spec["backend"], scheme=spec["scheme"], status="lost", attempts=retries + 1)
    try:
        cell.dry_run = dry_run(spec["backend"])
    except Exception:
        pass
    cell.detail = f"its Ray worker was lost {retries + 1} time{'s' if retries else ''}: " + first_line(exc)[:200]
    return cell


def _progress_line(cell: Cell, finished: int, total: int, to_run: int, ran: int, start: float) -> str:
    elapsed = time.monotonic() - start
    left = to_run - ran
    eta = f"ETA {_clock(elapsed / ran * left)}" if ran and left else "done"
    return f"[{finished}/{total}] {_clock(elapsed)} {eta}  {cell.label} x {cell.backend} {cell.scheme}: {status_text(cell)}"


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds + 0.5), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


def status_text(cell: Cell) -> str:
    """One phrase: what became of the cell."""
    if cell.status != "ran":
        return f"{cell.status}: {cell.detail}"
    if cell.error:
        return cell.error
    e = cell.edgeplug
    if not e.ok:
        return f"edgeplug fails: {e.error}"
    text = f"{e.partitions} partition{'s' if e.partitions != 1 else ''}, {e.cpu_nodes} CPU nodes"
    if e.max_abs_diff is not None:
        text += f", max |Δ| {e.max_abs_diff:.1e}"
    elif e.verify_error:
        text += f", verify fails: {e.verify_error}"
    return text + (f" (attempt {cell.attempts})" if cell.attempts > 1 else "")
