"""Writing what a lowering produces: paths checked before any work, files replaced atomically.

``check_output_paths`` refuses, before a minute is spent lowering, a target
that could not be written (a directory, a folder that is a file or is not
writable, the same file twice). ``write_files`` is the one writer the CLI and
``LoweringResult.save`` use: every file is first written whole to a temporary
beside its target, then all are renamed into place, so a reader sees each file
whole or not at all and a failure leaves nothing behind. A new file gets the
mode the umask gives; an overwritten file keeps its mode. SIGTERM and SIGINT
during a write remove the temporaries before the signal takes its usual course.
"""

from __future__ import annotations

import os
import secrets
import signal
import stat
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Optional, Union

from edgeplug.errors import OutputPathError

Data = Union[bytes, str]


def _first_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_one(path: Path, what: str) -> None:
    if path.is_dir():
        raise OutputPathError(f"cannot write {what} {path}: it is a directory; name a file inside it")
    folder = _first_existing(path.parent)
    if not folder.is_dir():
        raise OutputPathError(f"cannot write {what} {path}: {folder} is a file, not a folder")
    where = "its folder" if folder == path.parent else f"{folder}, where its folder would be created,"
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write {what} {path}: {where} is not writable")
    probe = _temporary(folder / "probe")
    try:  # permissions say yes; ask the file system (read-only mounts, root on /proc, quotas)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as exc:
        raise OutputPathError(f"cannot write {what} {path}: {where} is not writable ({exc.strerror or exc})") from exc


def check_output_paths(paths: Mapping[str, Optional[os.PathLike | str]]) -> None:
    """Refuse targets that cannot be written, before any work: ``{"the .pte": path, "the report": path}``.

    Raises ``OutputPathError`` naming the target and why (a directory, a folder
    that is a file or not writable, two targets that are the same file).
    """
    given = {what: Path(p) for what, p in paths.items() if p is not None}
    for what, path in given.items():
        _check_one(path, what)
    seen: dict[str, str] = {}
    for what, path in given.items():
        key = os.path.normcase(os.path.realpath(path))
        if key in seen:
            raise OutputPathError(
                f"{seen[key]} and {what} are the same file ({path}): the second would replace the first; "
                "give them different paths"
            )
        seen[key] = what


class _Interrupted(BaseException):
    """A SIGTERM/SIGINT arrived while temporaries existed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """While writing, turn SIGTERM/SIGINT into an exception so temporaries are removed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: object) -> None:
        raise _Interrupted(signum)

    # a signal the process ignores stays ignored
    previous = {
        s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGINT) if signal.getsignal(s) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _write_temporary(tmp: Path, target: Path, data: Data) -> None:
    # 0o666 through open(): the umask applies, as for any new file
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        return
    os.chmod(tmp, mode)  # an overwritten file keeps its mode


def write_files(files: Mapping[os.PathLike | str, Data]) -> None:
    """Write each ``{path: bytes or text}`` whole, then rename them all into place.

    Raises ``OSError`` (nothing replaced, no temporary left) when a write
    fails. A signal during the write removes the temporaries, then is
    delivered again with the handler that was in place.
    """
    targets = [(Path(p), data) for p, data in files.items()]
    temporaries: list[Path] = []
    try:
        with _signals_interrupt():
            current = targets[0][0] if targets else None
            try:
                for path, data in targets:
                    current = path
                    path.parent.mkdir(parents=True, exist_ok=True)
                    temporaries.append(_temporary(path))
                    _write_temporary(temporaries[-1], path, data)
                for tmp, (path, _) in zip(temporaries, targets):
                    current = path
                    os.replace(tmp, path)
            except OSError as exc:  # named by its target, not by the temporary
                for tmp in temporaries:
                    tmp.unlink(missing_ok=True)
                raise OSError(exc.errno, exc.strerror or str(exc), str(current)) from exc
            except BaseException:
                for tmp in temporaries:
                    tmp.unlink(missing_ok=True)
                raise
    except _Interrupted as exc:
        signal.raise_signal(exc.signum)  # the previous handler (or the default) takes it from here
        raise KeyboardInterrupt from None  # a handler that returned: stop the write all the same


def write_file(path: os.PathLike | str, data: Data) -> None:
    """``write_files({path: data})``."""
    write_files({path: data})


__all__ = ["check_output_paths", "write_file", "write_files"]
