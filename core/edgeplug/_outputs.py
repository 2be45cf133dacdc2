"""Writing what a lowering produces: paths checked before any work, files replaced atomically.

``check_output_paths`` refuses, before a minute is spent lowering, a target
that could not be written or must not be: a directory, a path with a trailing
slash (a folder), a folder that is a file or is not writable, a name too long
for its folder, a symbolic-link loop, a socket or block device, the same file
twice, and any of the run's inputs (the model file, a calibration file).
``write_files`` is the one writer the CLI and ``LoweringResult.save`` use:

- a regular file, or a path that does not exist, is first written whole to a
  short temporary beside it, then renamed into place, so a reader sees it
  whole or not at all and a failure leaves nothing behind. A symbolic link is
  followed: the file it names is replaced, the link stays. A new file gets the
  mode the umask gives; an overwritten file keeps its mode;
- ``-`` (stdout), a FIFO or a character device (``/dev/null``, a terminal) and
  anything reached through ``/dev/`` or ``/proc/`` (``/dev/stdout``) is
  *streamed*: opened and written, never renamed over;
- nothing else is ever replaced.

SIGTERM and SIGINT during a write remove the temporaries before the signal
takes its usual course; while the temporaries are renamed into place they wait
(blocked), so a set of files is never left half replaced (a new .pte beside the
old report), and they arrive once the set is whole. Two processes writing the
same outputs at once (two ``edgeplug lower -o m.pte --external-weights``) rename
their sets one after the other: each destination folder is locked (``flock`` on
the folder itself, nothing left behind) for the renames, so the files left are
one writer's set, never one's .pte beside the other's .ptd.
"""

from __future__ import annotations

import errno
import os
import secrets
import signal
import stat
import sys
import threading
import contextlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Union

from edgeplug._errors import OutputPathError

try:  # POSIX: the folder lock of a rename set (elsewhere the set is renamed unlocked)
    import fcntl
except ImportError:  # pragma: no cover (Windows)
    fcntl = None  # type: ignore[assignment]

#: bytes, text, or what streams itself into a binary file (``write_to_file(f)``: a serialized program)
Data = Union[bytes, str, Any]
PathArg = Union[os.PathLike, str]

#: the path that means standard output
STDOUT = "-"
#: a temporary's name keeps at most this many characters of its target's (the rest is pid and random)
_TEMP_STEM = 64


def names_a_folder(path: PathArg) -> bool:
    """``path`` ends with a separator (``out/``): it names a folder, not a file."""
    text = os.fspath(path)
    return text.endswith(os.sep) or (os.altsep is not None and text.endswith(os.altsep))


def is_stream(path: PathArg) -> bool:
    """``path`` is written in place, never renamed over: ``-``, a FIFO, a character device, or a
    regular file reached through ``/dev/`` or ``/proc/`` (``/dev/stdout`` redirected to a file)."""
    text = os.fspath(path)
    if text == STDOUT:
        return True
    try:
        mode = os.stat(text).st_mode
    except OSError:
        return False
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        return True
    return stat.S_ISREG(mode) and os.path.abspath(text).startswith(("/dev/", "/proc/"))


def _first_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _landing_file(path: Path, what: str) -> Path:
    """The file a write to ``path`` lands in (symbolic links followed); refuses a loop."""
    try:
        return Path(os.path.realpath(path, strict=False))
    except OSError as exc:  # pragma: no cover (realpath raises only in strict mode)
        raise OutputPathError(f"cannot write {what} {path}: {exc.strerror or exc}") from exc


def _check_links(path: Path, what: str) -> None:
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OutputPathError(
                f"cannot write {what} {path}: its symbolic links form a loop; remove the link or name another path"
            ) from exc


def _check_name_length(target: Path, what: str, given: Optional[Path] = None) -> None:
    """Each part of ``target`` fits its file system (the temporary's name is kept short: it always fits)."""
    folder = _first_existing(Path(os.path.abspath(target)).parent)
    try:
        name_max = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    for part in target.parts:
        size = len(os.fsencode(part))
        if size > name_max:
            raise OutputPathError(
                f"cannot write {what} {given or target}: its name is {size} bytes, "
                f"longer than the {name_max} its folder allows; name it shorter"
            )


def _check_stream(path: Path, what: str) -> None:
    if not os.access(path, os.W_OK):
        raise OutputPathError(f"cannot write {what} {path}: it is not writable")


def _check_one(raw: PathArg, what: str) -> None:
    if names_a_folder(raw):
        raise OutputPathError(
            f"cannot write {what} {os.fspath(raw)}: the trailing slash names a folder; name a file (inside it)"
        )
    if os.fspath(raw) == STDOUT:
        return
    path = Path(raw)
    _check_name_length(path, what)
    _check_links(path, what)
    if is_stream(path):
        _check_stream(path, what)
        return
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    except OSError as exc:
        raise OutputPathError(f"cannot write {what} {path}: {exc.strerror or exc}") from exc
    if mode is not None and stat.S_ISDIR(mode):
        raise OutputPathError(f"cannot write {what} {path}: it is a directory; name a file inside it")
    if mode is not None and not stat.S_ISREG(mode):
        kind = "a socket" if stat.S_ISSOCK(mode) else "a block device" if stat.S_ISBLK(mode) else "not a regular file"
        raise OutputPathError(f"cannot write {what} {path}: it is {kind}, which edgeplug never replaces; name a regular file")
    target = _landing_file(path, what)
    folder = _first_existing(target.parent)
    if not folder.is_dir():
        raise OutputPathError(f"cannot write {what} {path}: {folder} is a file, not a folder")
    where = "its folder" if folder == target.parent else f"{folder}, where its folder would be created,"
    _check_name_length(target, what, path)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write {what} {path}: {where} is not writable")
    probe = _temporary(folder / "probe")
    try:  # permissions say yes; ask the file system (read-only mounts, root on /proc, quotas)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as exc:
        raise OutputPathError(f"cannot write {what} {path}: {where} is not writable ({exc.strerror or exc})") from exc


def _identity(path: PathArg) -> Optional[tuple[int, int]]:
    """(device, inode) of the file ``path`` names, or None where it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _same_key(path: PathArg) -> str:
    text = os.fspath(path)
    if text == STDOUT:
        return STDOUT
    return os.path.normcase(os.path.realpath(text))


def check_output_paths(
    paths: Mapping[str, Optional[PathArg]], inputs: Optional[Mapping[str, Optional[PathArg]]] = None
) -> None:
    """Refuse targets that cannot or must not be written, before any work.

    ``paths``: ``{"the .pte": path, "the report": path}`` (None: not written).
    ``inputs``: the files the run reads, ``{"the model file": path, ...}``; an
    output that is one of them (by name, link or hard link) is refused.
    Raises ``OutputPathError`` naming the target, why, and what to do.
    """
    given = {what: p for what, p in paths.items() if p is not None}
    for what, path in given.items():
        _check_one(path, what)
    seen: dict[str, str] = {}
    for what, path in given.items():
        if is_stream(path) and os.fspath(path) != STDOUT:
            continue  # two streams to /dev/null are no conflict
        key = _same_key(path)
        if key in seen:
            raise OutputPathError(
                f"{seen[key]} and {what} are the same file ({os.fspath(path)}): the second would replace the first; "
                "give them different paths"
            )
        seen[key] = what
    for name, source in (inputs or {}).items():
        if source is None:
            continue
        source_id = _identity(source)
        for what, path in given.items():
            if os.fspath(path) == STDOUT or source_id is None:
                continue
            if _identity(path) == source_id or _same_key(path) == _same_key(source):
                raise OutputPathError(
                    f"{what} would be written over {name} {os.fspath(source)}: edgeplug never replaces its own "
                    f"inputs; give {what} another path"
                )


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
    # short whatever the target's length: a name that fits its folder always has a temporary that fits
    return path.with_name(f".{path.name[:_TEMP_STEM]}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _bytes(data: Data) -> bytes:
    return data.encode() if isinstance(data, str) else data


def _put(f: Any, data: Data) -> None:
    # a serialized program streams its pieces (``write_to_file``): no second copy of it in memory
    if hasattr(data, "write_to_file"):
        data.write_to_file(f)
    else:
        f.write(_bytes(data))


def _write_temporary(tmp: Path, target: Path, data: Data) -> None:
    # 0o666 through open(): the umask applies, as for any new file
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    with os.fdopen(fd, "wb") as f:
        _put(f, data)
        f.flush()
        os.fsync(f.fileno())
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        return
    os.chmod(tmp, mode)  # an overwritten file keeps its mode


def _stream(path: PathArg, data: Data) -> None:
    if os.fspath(path) == STDOUT:
        sys.stdout.flush()
        out = sys.stdout.buffer
        _put(out, data)
        out.flush()
        return
    # no O_CREAT: a stream is an existing FIFO or device, never a new file
    fd = os.open(path, os.O_WRONLY | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "wb") as f:
        _put(f, data)


class _Replaced:
    """The renames of one ``write_files``, undone if a later one fails: files written together (a .pte and
    its .ptd) are all replaced or none. What a rename replaces is kept first as a hard link beside it."""

    def __init__(self) -> None:
        #: (target, the old file's hard link or None, whether a file was there before)
        self.renamed: list[tuple[Path, Optional[Path], bool]] = []

    def replace(self, tmp: Path, path: Path) -> None:
        existed = os.path.lexists(path)
        old: Optional[Path] = None
        if existed:
            old = _temporary(path)
            try:
                os.link(path, old)
            except OSError:  # a file system without hard links: this one cannot be put back
                old = None
        try:
            os.replace(tmp, path)
        except BaseException:
            if old is not None:
                old.unlink(missing_ok=True)
            raise
        self.renamed.append((path, old, existed))

    def undo(self) -> None:
        for path, old, existed in reversed(self.renamed):
            with contextlib.suppress(OSError):
                if old is not None:
                    os.replace(old, path)  # the file that was there, back
                elif not existed:
                    os.unlink(path)  # a new file: gone again
        self.renamed.clear()

    def done(self) -> None:
        for _, old, _ in self.renamed:
            if old is not None:
                with contextlib.suppress(OSError):
                    old.unlink()
        self.renamed.clear()


class _SignalsHeld:
    """SIGTERM and SIGINT made to wait (the main thread's signal mask) from ``hold()`` until ``release()``;
    one that arrived meanwhile is delivered at ``release()``, to whatever handler is in place then."""

    def __init__(self) -> None:
        self.previous: Optional[set] = None

    def hold(self) -> None:
        if self.previous is not None or threading.current_thread() is not threading.main_thread():
            return
        if hasattr(signal, "pthread_sigmask"):
            self.previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})

    def release(self) -> None:
        if self.previous is not None:
            previous, self.previous = self.previous, None
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


#: every file this process wrote whole, in order (``written_files``): what a message can say was written
_WRITTEN: list[str] = []


def written_files() -> list[str]:
    """The files (and streams) this process has written whole so far, in order, as their paths were given."""
    return list(_WRITTEN)


@contextmanager
def _folders_locked(paths: list[Path]) -> Iterator[None]:
    """An exclusive ``flock`` on each folder the files land in, in one order (no two writers deadlock), so
    another edgeplug writing there renames its set before or after this one, never between its renames.
    A file system without locks is written unlocked, as before."""
    fds: list[int] = []
    try:
        for folder in sorted({os.path.realpath(p.parent) for p in paths}) if fcntl is not None else ():
            try:
                fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            except OSError:
                continue
            fds.append(fd)
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        for fd in fds:
            os.close(fd)  # closing the folder's descriptor releases its lock


def _rename_all(temporaries: list[Path], regular: list[tuple[Path, Data]], replaced: "_Replaced") -> None:
    """Each temporary to its target, as one set, locked against other edgeplug writers."""
    with _folders_locked([path for path, _ in regular]):
        for tmp, (path, _) in zip(temporaries, regular):
            try:
                replaced.replace(tmp, path)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror or str(exc), os.fspath(path)) from exc
        replaced.done()


def write_files(files: Mapping[PathArg, Data]) -> None:
    """Write each ``{path: bytes or text}``: regular files atomically, streams in place.

    Regular files are written to temporaries first, then the streams, then the
    temporaries are renamed into place: a failure before the renames replaces
    nothing and leaves no temporary, and a rename that fails puts back what the
    renames before it replaced (the files are written together or not at all:
    a .pte and its .ptd). Raises ``OSError`` naming the target, and
    ``OutputPathError`` for a target that is neither a regular file, a missing
    path nor a stream. A signal during the write removes the temporaries, then
    is delivered again with the handler that was in place.
    """
    regular: list[tuple[Path, Data]] = []
    streams: list[tuple[PathArg, Data]] = []
    for p, data in files.items():
        if is_stream(p):
            streams.append((p, data))
            continue
        if names_a_folder(p):
            raise OutputPathError(f"cannot write {os.fspath(p)}: the trailing slash names a folder; name a file")
        _check_links(Path(p), "the file")
        target = Path(os.path.realpath(p))  # a link stays; the file it names is replaced
        try:
            mode = os.stat(target).st_mode
        except (FileNotFoundError, NotADirectoryError):
            mode = None
        if mode is not None and not stat.S_ISREG(mode):
            raise OutputPathError(f"cannot write {os.fspath(p)}: it is not a regular file, which edgeplug never replaces")
        regular.append((target, data))
    temporaries: list[Path] = []
    replaced = _Replaced()
    held = _SignalsHeld()  # from the first rename until the set is whole or put back: no signal splits it
    try:
        with _signals_interrupt():
            current: PathArg = regular[0][0] if regular else ""
            try:
                for path, data in regular:
                    current = path
                    path.parent.mkdir(parents=True, exist_ok=True)
                    temporaries.append(_temporary(path))
                    _write_temporary(temporaries[-1], path, data)
                for stream, data in streams:
                    current = stream
                    _stream(stream, data)
                held.hold()
                current = ""
                _rename_all(temporaries, regular, replaced)
            except OSError as exc:  # named by its target, not by the temporary
                held.hold()
                replaced.undo()
                for tmp in temporaries:
                    tmp.unlink(missing_ok=True)
                raise OSError(exc.errno, exc.strerror or str(exc), os.fspath(current) if current else exc.filename) from exc
            except BaseException:
                held.hold()
                replaced.undo()
                for tmp in temporaries:
                    tmp.unlink(missing_ok=True)
                raise
            _WRITTEN.extend(os.fspath(p) for p in files)
        # the handlers before this write are back: a signal held during the renames reaches them now
        held.release()
    except _Interrupted as exc:
        held.release()
        signal.raise_signal(exc.signum)  # the previous handler (or the default) takes it from here
        raise KeyboardInterrupt from None  # a handler that returned: stop the write all the same
    finally:
        held.release()


def write_file(path: PathArg, data: Data) -> None:
    """``write_files({path: data})``."""
    write_files({path: data})


__all__ = ["STDOUT", "check_output_paths", "is_stream", "names_a_folder", "write_file", "write_files", "written_files"]
