"""Running a user's model file without letting it take over the process.

A model file is executed as Python (``edgeplug.examples.import_user_file``). While
its module runs and its function is called, ``contained`` keeps what it does to
the process from reaching the lowering:

- what it prints (``sys.stdout``, ``sys.stderr``) is held when asked (the command
  without ``-v``): a file that prints thousands of lines cannot bury the one line
  that says what went wrong, nor write into a ``.pte`` streamed to stdout;
- a change of the working folder (``os.chdir``) is undone, so the outputs land
  where they were checked (relative to where the command ran), and the line that
  did it is named;
- a thread it starts and leaves running is named with the line that started it;
  the command does not wait for it when it ends (``app.main``);
- torch's process-wide defaults (the default dtype and device) are put back as they
  were, and the line that changed them is named: a model file, calibration file or
  plugin that calls ``torch.set_default_dtype(torch.float64)`` would otherwise change
  every lowering after it.

The plugin manager runs plugins' imports and hooks inside it too, their prints sent
to stderr (never into a ``.pte`` streamed to stdout).

``where_in_user_code`` finds the innermost frame of the user's own files, for
messages that name the model's line.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import os
import sys
import tempfile
import textwrap
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from edgeplug._failures import _is_user_file


@dataclass
class Effects:
    """What the model's code did to the process while it ran (``contained``)."""

    #: what it printed, held (empty where nothing was held)
    printed: str = ""
    #: ``(folder it changed to, where)`` for the last ``os.chdir``, already undone; None where it did not
    chdir: Optional[tuple[str, str]] = None
    #: ``(thread, where it was started)`` for each non-daemon thread it started that is still running
    threads: list[tuple[threading.Thread, str]] = field(default_factory=list)
    #: ``(what, the value it set, the value put back, where)`` for each of torch's defaults it changed
    torch_defaults: list[tuple[str, str, str, str]] = field(default_factory=list)

    def printed_lines(self) -> int:
        return len(self.printed.splitlines())


def _location(file: str, line: int, func: str) -> str:
    rel = os.path.relpath(file) if not os.path.relpath(file).startswith("..") else file
    return f"{rel}:{line}, in {func}"


def where_in_user_code(frame: Any = None) -> str:
    """``model.py:12, in make`` for the innermost frame of the caller's stack in the user's own files ('')."""
    f = frame if frame is not None else sys._getframe(1)
    while f is not None:
        code = f.f_code
        if _is_user_file(code.co_filename) and not (f.f_globals.get("__name__") or "").startswith("edgeplug"):
            return _location(code.co_filename, f.f_lineno, getattr(code, "co_qualname", code.co_name))
        f = f.f_back
    return ""


def returned_at(fn: Any) -> str:
    """``model.py:14`` for the function ``fn``'s return statement (its only one; else where it is defined),
    '' where it has no source file."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return ""
    line = code.co_firstlineno
    try:
        lines, first = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
        body = tree.body[0]
        returns = [n for n in _own_nodes(body) if isinstance(n, ast.Return)]
        if len(returns) == 1:
            line = first + returns[0].lineno - 1
    except (OSError, TypeError, SyntaxError, IndexError):
        pass
    rel = os.path.relpath(code.co_filename)
    return f"{code.co_filename if rel.startswith('..') else rel}:{line}"


def _own_nodes(fn_node: Any) -> Iterator[Any]:
    """The nodes of a function's body, not those of functions or classes defined inside it."""
    stack = list(ast.iter_child_nodes(fn_node))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


class _Watch:
    """The audit hook's state: one hook for the process (audit hooks cannot be removed), active only
    inside ``contained``."""

    active: Optional[Effects] = None
    installed = False


def _audit(event: str, args: tuple) -> None:
    effects = _Watch.active
    if effects is None or event != "os.chdir":
        return
    where = where_in_user_code(sys._getframe(1))
    effects.chdir = (os.fspath(args[0]) if args else "?", where)


@contextlib.contextmanager
def _threads_named(effects: Effects) -> Iterator[None]:
    """Record where each thread started inside the block was started (``Thread.start`` by the user's line)."""
    original = threading.Thread.start
    started: dict[int, tuple[threading.Thread, str]] = {}

    def start(self: threading.Thread) -> None:
        started[id(self)] = (self, where_in_user_code(sys._getframe(1)))
        original(self)

    before = set(threading.enumerate())
    threading.Thread.start = start  # type: ignore[method-assign]
    try:
        yield
    finally:
        threading.Thread.start = original  # type: ignore[method-assign]
        for t in threading.enumerate():
            if t in before or t.daemon or not t.is_alive():
                continue
            effects.threads.append(started.get(id(t), (t, "")))


#: torch's process-wide defaults a user's code may change: (what, torch's setter, its getter); the
#: default device's getter is newer than some torch releases, so each is looked up when used
_TORCH_DEFAULTS = (
    ("default dtype", "set_default_dtype", "get_default_dtype"),
    ("default device", "set_default_device", "get_default_device"),
)


def _torch_defaults(torch: Any) -> dict[str, Any]:
    out = {}
    for what, _, getter in _TORCH_DEFAULTS:
        get = getattr(torch, getter, None)
        if get is not None:
            with contextlib.suppress(Exception):
                out[what] = get()
    return out


@contextlib.contextmanager
def _torch_defaults_kept(effects: Effects) -> Iterator[None]:
    """torch's defaults as they were before the block, each change undone and recorded, with the line that
    made it where torch was loaded before the block (its setters are watched then)."""
    torch = sys.modules.get("torch")
    before = _torch_defaults(torch) if torch is not None else None
    where: dict[str, str] = {}
    originals: dict[str, Any] = {}
    if torch is not None:
        for what, setter, _ in _TORCH_DEFAULTS:
            original = getattr(torch, setter, None)
            if original is None:
                continue

            def watched(*a: Any, _what: str = what, _original: Any = original, **k: Any) -> Any:
                where[_what] = where_in_user_code(sys._getframe(1)) or _frame_location(sys._getframe(1))
                return _original(*a, **k)

            originals[setter] = original
            setattr(torch, setter, watched)
    try:
        yield
    finally:
        for setter, original in originals.items():
            setattr(torch, setter, original)
        torch = sys.modules.get("torch")
        if torch is not None:
            # torch first imported inside the block starts at its own defaults
            start = before if before is not None else {"default dtype": torch.float32, "default device": torch.device("cpu")}
            after = _torch_defaults(torch)
            for what, setter, _ in _TORCH_DEFAULTS:
                if what in start and what in after and after[what] != start[what]:
                    with contextlib.suppress(Exception):
                        getattr(torch, setter)(start[what])
                    effects.torch_defaults.append((what, str(after[what]), str(start[what]), where.get(what, "")))


def _frame_location(frame: Any) -> str:
    """``FILE:LINE, in FUNC`` of ``frame`` (a plugin's own line, which ``where_in_user_code`` may not count
    as the user's: an installed plugin lives in site-packages)."""
    code = frame.f_code
    return _location(code.co_filename, frame.f_lineno, getattr(code, "co_qualname", code.co_name))


def torch_defaults_lines(effects: Effects, who: str) -> list[str]:
    """One sentence per torch default ``who`` changed (already put back), naming the line that did it."""
    return [
        f"{who} changed torch's {what} to {value}{f' at {where}' if where else ''}; edgeplug put it back to "
        f"{restored}, as every lowering expects it (set a dtype or device where the tensors are made instead "
        f"of torch's process-wide default)"
        for what, value, restored, where in effects.torch_defaults
    ]


@contextlib.contextmanager
def contained(
    effects: Effects, *, hold_output: bool = False, stdout_to_stderr: bool = False
) -> Iterator[Effects]:
    """Run the user's code inside: the working folder and torch's defaults are restored, threads and prints
    are recorded in ``effects`` (prints held, not shown, with ``hold_output``; with ``stdout_to_stderr``
    what it prints to stdout goes to stderr). On a failure the held prints are on the exception too
    (``model_output``), for ``--debug``."""
    if not _Watch.installed:
        sys.addaudithook(_audit)
        _Watch.installed = True
    cwd = os.getcwd()
    previous, _Watch.active = _Watch.active, effects
    held = tempfile.TemporaryFile("w+", encoding="utf-8", errors="backslashreplace") if hold_output else None
    redirect: contextlib.AbstractContextManager[Any] = contextlib.nullcontext() if held is None else _both_streams(held)
    if held is None and stdout_to_stderr:
        redirect = contextlib.redirect_stdout(sys.stderr)
    try:
        with _threads_named(effects), _torch_defaults_kept(effects), redirect:
            try:
                yield effects
            except BaseException as exc:
                if held is not None:
                    exc.model_output = _held_text(held)  # type: ignore[attr-defined]  # the user's error carries its prints
                raise
    finally:
        _Watch.active = previous
        if held is not None:
            effects.printed = _held_text(held)
            held.close()
        if os.getcwd() != cwd:
            os.chdir(cwd)
        else:
            effects.chdir = None  # it came back (or changed to where it was): nothing to undo


@contextlib.contextmanager
def _both_streams(held: Any) -> Iterator[None]:
    with contextlib.redirect_stdout(held), contextlib.redirect_stderr(held):
        yield


def _held_text(held: Any) -> str:
    try:
        held.flush()
        held.seek(0)
        return held.read()
    except Exception:  # a stream the user's code closed: nothing to show
        return ""


def left_running() -> list[threading.Thread]:
    """Non-daemon threads other than this one still running: what the interpreter would wait for at exit."""
    me = threading.current_thread()
    return [t for t in threading.enumerate() if t is not me and not t.daemon and t.is_alive()]


__all__ = ["Effects", "contained", "returned_at", "left_running", "torch_defaults_lines", "where_in_user_code"]
