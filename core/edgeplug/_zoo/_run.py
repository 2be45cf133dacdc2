"""``edgeplug._zoo.run``: every cell of models x backends x schemes, on local processes or a Ray cluster.

Each finished cell is appended to the results file as one JSON line (one
``write`` of the whole line under an exclusive lock, then ``fsync``), so a run
that stops, for any reason, keeps every cell it finished; ``resume=True`` reads
that file and runs only the cells it lacks.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence

from edgeplug._errors import EdgeplugError
from edgeplug._zoo._record import FLOAT, Cell
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
    import edgeplug
    from edgeplug._zoo._cell import schemes_of
    from edgeplug._zoo._models import resolve_models

    keys = resolve_models(_split(models) if models is not None else None)
    installed = list(edgeplug.backends())
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
    """The JSON lines file: cells recorded so far, and an atomic append of one more."""

    def __init__(self, path: Optional[str], resume: bool, settings: Settings) -> None:
        self.path = path
        self.recorded: dict[tuple[str, str, str], Cell] = {}
        self._fd: Optional[int] = None
        if path is None:
            return
        exists = os.path.exists(path) and os.path.getsize(path) > 0
        if exists and not resume:
            raise EdgeplugError(
                f"{path} already holds results: pass --resume (resume=True) to run only the cells it lacks, "
                "or name another file"
            )
        if exists:
            self.recorded = _read(path, settings)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if exists and not _ends_with_newline(path):
            os.write(self._fd, b"\n")  # a line cut short by a crash stays alone on its line, unread

    def append(self, cell: Cell, settings: Settings) -> None:
        if self._fd is None:
            return
        import fcntl

        line = (json.dumps({**cell.to_dict(), "settings": settings.as_dict()}, sort_keys=True) + "\n").encode()
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # another run appending to the same file waits
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _read(path: str, settings: Optional[Settings]) -> dict[tuple[str, str, str], Cell]:
    cells: dict[tuple[str, str, str], Cell] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line a crash cut short: its cell runs again
            recorded = data.get("settings")
            if settings is not None and recorded is not None and recorded != settings.as_dict():
                raise EdgeplugError(
                    f"{path}:{number} was recorded with {recorded}, this run has {settings.as_dict()}: "
                    "resume with the same settings, or write the results to another file"
                )
            cell = Cell.from_dict(data)
            cells[cell.key] = cell
    return cells


def load_cells(path: str) -> list[Cell]:
    """The cells a results file holds (the last line of each cell wins)."""
    return list(_read(path, None).values())


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
) -> list[Cell]:
    """Run the zoo: each cell (model x backend x scheme) lowered, verified where it can be, timed,
    in its own process; the cells, in plan order (recorded ones from ``out`` included).

    ``timeout`` (seconds) and ``memory_limit`` (MB) hold per cell process; a cell past either is
    recorded as ``timeout`` or ``memory``. A cell whose process is killed is started again at
    most ``retries`` times (under Ray: its task's ``max_retries``), then recorded as ``lost``.
    ``out``: the JSON lines file; ``resume``: run only the cells it lacks. ``executor``: ``local``
    (``jobs`` processes at a time) or ``ray`` (a task per cell; a local cluster of ``jobs`` CPUs,
    or the cluster at ``address``). ``progress`` gets a line per finished cell."""
    if executor not in EXECUTORS:
        raise EdgeplugError(f"unknown executor {executor!r}: use one of {', '.join(EXECUTORS)}")
    if jobs < 1:
        raise EdgeplugError(f"jobs must be at least 1, not {jobs}")
    if address and executor != "ray":
        raise EdgeplugError("an address is for --executor ray")
    for name, value in (("timeout", timeout), ("memory_limit", memory_limit)):
        if value is not None and value <= 0:
            raise EdgeplugError(f"{name} must be positive, not {value}")
    settings = Settings(layers=layers, compare_stock=compare_stock, repeat=repeat)
    cells, notes = plan(models, backends, schemes)
    say = progress or (lambda line: None)
    for note in notes:
        say(note)
    results = Results(out, resume, settings)
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
            stream = (_local if executor == "local" else _ray)(
                specs, jobs, timeout, memory_limit, retries, attempts_dir, address
            )
            for cell in stream:
                results.append(cell, settings)
                done[cell.key] = cell
                finished += 1
                say(_progress_line(cell, finished, total, len(todo), finished - (total - len(todo)), start))
    finally:
        kill_live()
        results.close()
    return [done[k] for k in cells if k in done]


def _local(specs, jobs, timeout, memory_mb, retries, attempts_dir, address) -> Iterator[Cell]:
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


def _ray(specs, jobs, timeout, memory_mb, retries, attempts_dir, address) -> Iterator[Cell]:
    """Each cell a Ray task running ``execute_cell``: 1 CPU, ``memory_mb`` of memory, ``retries`` retries."""
    try:
        import ray
    except ImportError as exc:
        raise EdgeplugError(
            f"--executor ray needs ray ({exc}): pip install 'edgeplug[ray]'"
        ) from None
    started_here = not ray.is_initialized()
    if started_here:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(execute_cell)
        options = {"num_cpus": 1, "max_retries": retries, "retry_exceptions": False}
        if memory_mb:
            options["memory"] = int(memory_mb) << 20
        pending = {
            # the limits are the local executor's: the cell's own process holds them, not the Ray worker
            task.options(**options).remote(spec, timeout, memory_mb, retries, "ray", attempts_dir): spec
            for spec in specs
        }
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    spec = pending.pop(ref)
                    try:
                        yield Cell.from_dict(ray.get(ref))
                    except ray.exceptions.RayError as exc:
                        yield _lost(spec, exc, retries)
        finally:
            for ref in pending:  # a stopped run leaves nothing running on the cluster
                ray.cancel(ref, force=True)
    finally:
        if started_here:
            ray.shutdown()


def _lost(spec: dict, exc: BaseException, retries: int) -> Cell:
    from edgeplug._failures import first_line
    from edgeplug._zoo._lowering import dry_run

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
