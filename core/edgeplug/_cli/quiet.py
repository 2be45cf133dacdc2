"""What keeps the terminal to edgeplug's own lines without ``-v``: native libraries' output, taken at the fd.

Python's logging and warnings are quieted in ``app._quiet_dependencies``. A vendor SDK
(a vendor's ``[INFO]`` log lines) and ExecuTorch's C++ runtime log
(``E 00:00:03 executorch:...``) write to file descriptors 1 and 2 themselves, so
no Python setting reaches them: while a lowering runs, ``native_output_hidden``
points both descriptors at a temporary file, and Python's ``sys.stdout`` and
``sys.stderr`` (edgeplug's progress and error lines, the model's own prints) at
the terminal they were. A failure keeps what was hidden on the exception
(``hidden_output``), for ``--debug``. ``silence_at_exit`` does the same for what
the libraries print while the process ends (an SDK's destructors).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import io
import os
import re
import sys
import tempfile
from typing import IO, Any, Iterator, Optional, TextIO


def _flush_c_streams() -> None:
    """Flush C's stdio buffers (what a library printf-ed and C has not written yet)."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def _fd_of(stream: Optional[TextIO]) -> Optional[int]:
    try:
        return stream.fileno() if stream is not None else None
    except (AttributeError, OSError, ValueError):  # pytest's capsys, a StringIO: not a descriptor
        return None


def _terminal_stream(fd: int, like: TextIO) -> TextIO:
    """A text stream on a duplicate of ``fd`` (what the descriptor was before it was pointed elsewhere)."""
    return io.TextIOWrapper(
        io.FileIO(os.dup(fd), "w", closefd=True),
        encoding=getattr(like, "encoding", None) or "utf-8",
        errors=getattr(like, "errors", None) or "backslashreplace",
        line_buffering=True,
        write_through=True,
    )


#: a line of ExecuTorch's C++ log as its Python runtime prints it, through Python's ``sys.stderr`` (not the
#: descriptor): ``[cpuinfo_utils.cpp:71] Reading file ...``
_NATIVE_LOG_LINE = re.compile(r"^\[[\w./-]+\.(?:cpp|cc|cxx|c|h|hpp):\d+\] ")


class _NativeLogsAside(io.TextIOBase):
    """Python's stderr while the libraries are quiet: whole lines in ExecuTorch's log format go to the hidden
    file with what the descriptors held; every other line (edgeplug's own) reaches the terminal."""

    def __init__(self, terminal: TextIO, hidden: Any) -> None:
        self.terminal, self.hidden, self.pending = terminal, hidden, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if _NATIVE_LOG_LINE.match(line):
                self.hidden.write((line + "\n").encode("utf-8", "replace"))
            else:
                self.terminal.write(line + "\n")
        return len(text)

    def flush(self, whole: bool = False) -> None:
        # a line without its end yet is shown (a prompt, a partial print), unless it may be a log line still
        # being written: ExecuTorch writes one piece at a time ('[', 'cpuinfo_utils.cpp', ':', '71', '] ', ...)
        if self.pending and (whole or not self.pending.startswith("[")):
            text, self.pending = self.pending, ""
            self.terminal.write(text)
        self.terminal.flush()

    def fileno(self) -> int:
        return self.terminal.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.terminal, "encoding", "utf-8")

    def isatty(self) -> bool:
        return self.terminal.isatty()

    def close(self) -> None:
        self.flush(whole=True)
        self.terminal.close()


@contextlib.contextmanager
def native_output_hidden() -> Iterator[None]:
    """Descriptors 1 and 2 into a temporary file while the block runs; Python's streams stay on the terminal."""
    streams = {1: "stdout", 2: "stderr"}
    originals = {fd: getattr(sys, name) for fd, name in streams.items()}
    for s in originals.values():
        with contextlib.suppress(Exception):
            s.flush()
    _flush_c_streams()
    saved = {fd: os.dup(fd) for fd in streams}
    hidden = tempfile.TemporaryFile()
    swapped: dict[str, Any] = {}  # a terminal stream, or the one that holds native logs aside
    try:
        for fd, name in streams.items():
            if _fd_of(originals[fd]) == fd:  # Python writes this descriptor: keep its writes on the terminal
                swapped[name] = _terminal_stream(fd, originals[fd])
        if "stderr" in swapped:  # ExecuTorch's runtime logs through Python's stderr: held with the rest
            swapped["stderr"] = _NativeLogsAside(swapped["stderr"], hidden)
        for fd in streams:
            os.dup2(hidden.fileno(), fd)
        for name, stream in swapped.items():
            setattr(sys, name, stream)
        try:
            yield
        except BaseException as exc:
            exc.hidden_output = _hidden_text(hidden, originals, saved)  # type: ignore[attr-defined]  # a foreign error carries what was hidden
            raise
    finally:
        for s in (*originals.values(), *swapped.values()):
            with contextlib.suppress(Exception):
                s.flush()
        _flush_c_streams()
        for fd, dup in saved.items():
            os.dup2(dup, fd)
            os.close(dup)
        for name, stream in swapped.items():
            setattr(sys, name, originals[{v: k for k, v in streams.items()}[name]])
            with contextlib.suppress(Exception):
                stream.close()
        hidden.close()


def _hidden_text(hidden: IO[bytes], originals: dict, saved: dict) -> str:
    for s in originals.values():
        with contextlib.suppress(Exception):
            s.flush()
    _flush_c_streams()
    hidden.seek(0)
    return hidden.read().decode("utf-8", "replace")


def silence_at_exit() -> None:
    """From the last exit handler on, descriptors 1 and 2 go nowhere: what libraries print while the
    process ends (their destructors) stays off the terminal. For the console command only."""
    def silence() -> None:
        for s in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                s.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                os.dup2(devnull, fd)
        os.close(devnull)

    atexit.register(silence)  # handlers run last-registered first: this one before the libraries'
