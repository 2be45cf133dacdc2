"""The `edgeplug` command: its parser, and how a failure reaches the terminal (one line, an exit code).

The commands live beside this module: ``plugins`` (backends, plugins, new-backend, examples) and
``lower`` (lower, report); the zoo's in ``edgeplug._zoo._cli``. Logging is configured here and
nowhere else in edgeplug.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import logging
import os
import signal
import sys
import threading
import traceback
import warnings
from typing import Any, Optional, Sequence

from edgeplug._api import PluginApiDeprecationWarning
from edgeplug._cli.common import DEBUG_ENV, DISK_FULL, DISK_FULL_CODE, STREAM_ERRORS, err, say
from edgeplug._cli.quiet import native_output_hidden, silence_at_exit
from edgeplug._cli.lower import cmd_lower, cmd_report, installed_schemes, positive_int_arg, tolerance_arg
from edgeplug._cli.plugins import cmd_backends, cmd_examples, cmd_new_backend, cmd_plugins
from edgeplug._errors import EdgeplugError
from edgeplug._executorch import version_gap
from edgeplug._failures import first_line, root_cause, user_frame
from edgeplug._outputs import written_files
from edgeplug._registry import PluginWarning
from edgeplug._scaffold import DEFAULT_PARTITIONER, KNOWN_PARTITIONERS
from edgeplug._user_code import _location, left_running
from edgeplug._zoo._cli import add_arguments as add_zoo_arguments  # argparse only: no torch
from edgeplug._zoo._cli import command as zoo_command


class _LowerHelp(argparse.HelpFormatter):
    """Fills in ``{schemes}`` when help is printed, so only ``--help`` loads the plugins to list them."""

    def _get_help_string(self, action: argparse.Action) -> Optional[str]:
        text = action.help or ""
        if "{schemes}" not in text:
            return text
        with _libraries_quiet():  # --help exits before main() quiets them: the plugins' imports are quieted here
            return text.replace("{schemes}", installed_schemes())


@contextlib.contextmanager
def _libraries_quiet():
    """While ``--help`` loads the plugins to list their schemes: no library's warning or log line (torchao's
    "Failed to load ..._C_mxfp8", torch's pytree deprecation) and nothing native libraries print themselves;
    a plugin problem stays an edgeplug warning."""
    with warnings.catch_warnings(), native_output_hidden():
        warnings.simplefilter("ignore")
        warnings.filterwarnings("default", category=PluginWarning)
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgeplug", description="Lower PyTorch models to ExecuTorch backends through plugins.")
    sub = p.add_subparsers(dest="command", required=True)
    _add_listings(sub)
    _add_report(sub)
    lo = sub.add_parser("lower", help="lower a model for a backend and write a .pte", formatter_class=_LowerHelp)
    _add_lower_target(lo)
    _add_lower_verification(lo)
    _add_lower_outputs(lo)
    _add_lower_quantization(lo)
    _add_lower_views(lo)
    lo.add_argument(
        "--calibration-batches", metavar="N", type=positive_int_arg, default=None,
        help="read at most N calibration batches (default: 100); the report counts them and says when there were more",
    )
    lo.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    lo.add_argument("-v", "--verbose", action="store_true", help="keep the warnings and logs of torch/executorch")
    lo.add_argument("--debug", action="store_true", help=f"on an error, print its traceback too (or set {DEBUG_ENV}=1)")
    lo.set_defaults(fn=cmd_lower)

    zo = sub.add_parser("zoo", help="lower a model set x backends x schemes, each cell in its own process (local or Ray)")
    add_zoo_arguments(zo)
    zo.set_defaults(fn=cmd_zoo)
    return p


def _add_listings(sub: argparse._SubParsersAction) -> None:
    """``backends``, ``plugins``, ``new-backend`` and ``examples``: what is installed, and a new plugin."""
    b = sub.add_parser("backends", help="list installed backends (fast: --probe and --adapter check more)")
    b.add_argument(
        "--adapter", action="store_true",
        help="also open the wgpu adapter host-kernel verification (verify 'kernels') runs on, and name it",
    )
    b.add_argument("--no-adapter", action="store_true", help="do not look for a wgpu adapter (the default)")
    b.add_argument(
        "--probe", action="store_true",
        help="also build each available backend's partitioner once to check it (imports executorch and each SDK: "
        "slower)",
    )
    b.add_argument("--no-probe", action="store_true", help="do not build the partitioners (the default)")
    b.set_defaults(fn=cmd_backends)
    pl = sub.add_parser("plugins", help="list plugins: distribution, entry point, status, what each adds to which backend")
    pl.add_argument("--json", action="store_true", help="print the listing as JSON")
    pl.set_defaults(fn=cmd_plugins)
    nb = sub.add_parser("new-backend", help="write a plugin package for a new backend (every hook stubbed, a conformance test)")
    nb.add_argument("name", help="the backend's name (lower-case; the package is edgeplug_NAME)")
    nb.add_argument(
        "--partitioner", default=DEFAULT_PARTITIONER,
        help="executorch partitioner underneath: "
        + ", ".join(f"{n} (default)" if n == DEFAULT_PARTITIONER else n for n in KNOWN_PARTITIONERS)
        + ", or MODULE:CLASS",
    )
    nb.add_argument("--backend-id", help="the id the partitioner tags partitions with (needed with MODULE:CLASS)")
    nb.add_argument(
        "--partitioner-args", metavar="ARGS",
        help="the partitioner's constructor arguments, as Python source inside CLASS(...), e.g. "
        "\"compile_spec=TosaCompileSpec('TOSA-1.0+FP')\" (needed where its constructor has required parameters)",
    )
    nb.add_argument(
        "--import", dest="imports", action="append", default=[], metavar="MODULE:NAME",
        help="a name --partitioner-args uses, imported in the generated factory; repeatable",
    )
    nb.add_argument("-o", "--output", default=".", help="folder to write edgeplug-NAME/ in (default: here)")
    nb.set_defaults(fn=cmd_new_backend)
    e = sub.add_parser("examples", help="list the built-in models `edgeplug lower NAME` builds")
    e.set_defaults(fn=cmd_examples)


def _add_report(sub: argparse._SubParsersAction) -> None:
    rp = sub.add_parser("report", help="show a saved JSON report, or turn it into an HTML page or Model Explorer files")
    rp.add_argument("report", help="a JSON report `edgeplug lower --report X.json` wrote")
    rp.add_argument("--html", metavar="OUT.html", help="write the report as one self-contained HTML page here")
    rp.add_argument("--explore", metavar="DIR", help="write the graph and its overlays for Model Explorer into DIR")
    rp.set_defaults(fn=cmd_report)


def _add_lower_target(lo: argparse.ArgumentParser) -> None:
    """What to lower, for which backend, and where the .pte and the report go."""
    lo.add_argument(
        "model",
        help="a built-in model's name (`edgeplug examples` lists them: handwritten-llama-decoder, mlp, "
        "transformers-qwen3, ...), or FILE.py:ATTR: FILE.py is executed (as `python FILE.py` would, "
        "its folder on sys.path) and ATTR called to return (model, args) or (model, args, kwargs)",
    )
    lo.add_argument("--backend", "-b", required=True)
    lo.add_argument(
        "-o", "--output",
        help="where to write the .pte (default: MODEL-BACKEND.pte): a file, a folder (FOLDER/), or - for stdout; "
        "a FIFO or device is written in place; nothing but a regular file is ever replaced, never an input",
    )
    lo.add_argument("--report", help="also write the report as JSON here (a file, FOLDER/, or -)")


def _add_lower_verification(lo: argparse.ArgumentParser) -> None:
    """--verify and what it accepts."""
    lo.add_argument("--verify", action="store_true", help="run the lowered program and compare with eager")
    lo.add_argument(
        "--tolerance", type=tolerance_arg, default=None,
        help="max |difference| --verify accepts, a finite number >= 0 (default: by output dtype, "
        "1e-4 for fp32, a few ulps of the output's magnitude for fp16/bf16)",
    )
    lo.add_argument(
        "--verify-steps", type=int, default=None, metavar="N",  # checked once, where lower checks it (prepare)
        help="with --verify (implied), for a decoder with a KV cache: generate N tokens greedily from the "
        "example prompt through the .pte (prefill, then one-token decode steps) and through eager (the "
        "quantized model where quantized); fails naming the first step that differs and eager's logit "
        "margin there, unless it is a near-tie",
    )


def _add_lower_outputs(lo: argparse.ArgumentParser) -> None:
    """What is written and measured: dry runs, stand-in programs, external weights, memory."""
    lo.add_argument("--dry-run", action="store_true", help="partition and report; write no .pte")
    lo.add_argument(
        "--write-stand-in", action="store_true",
        help="where the delegates hold stand-in payloads (--dry-run, a backend whose preprocess stands in for its compiler), write the program "
        "anyway, as OUT.stand-in.pte: it does not run. Without it such a lowering writes no .pte",
    )
    lo.add_argument(
        "--external-weights", action="store_true",
        help="write the weights once into OUT.ptd beside OUT.pte (executorch's named data; backends whose "
        "delegate supports it)",
    )
    lo.add_argument(
        "--profile-memory", action="store_true", help="each stage's peak resident memory in the stage table (Linux)"
    )
    lo.add_argument(
        "--etrecord", metavar="PATH",
        help="write ExecuTorch's ETRecord of the lowering to PATH (the aten, edge and executorch programs), for "
        "ExecuTorch's Inspector beside the .pte's ETDump (calculate_numeric_gap names the first op that diverges); "
        "written when the lowering ends, --verify failing or not",
    )


def _add_lower_quantization(lo: argparse.ArgumentParser) -> None:
    """--quantize and its calibration data (--calibration-batches is listed after the views)."""
    lo.add_argument(
        "--quantize", metavar="SCHEME",
        help="quantize with the backend's own PT2E quantizer first ({schemes}); --verify then compares with "
        "the quantized model",
    )
    lo.add_argument(
        "--calibration", metavar="FILE.py:ATTR",
        help="calibration inputs for --quantize: ATTR is a list of input tuples, or a callable returning one "
        "(default: the example inputs)",
    )


def _add_lower_views(lo: argparse.ArgumentParser) -> None:
    """The stock flow beside the report, and Model Explorer's files."""
    lo.add_argument(
        "--compare-stock", action="store_true",
        help="also lower with the backend's own executorch partitioner alone and add its partitioning to the "
        "report (the HTML page shows both, with the differences counted)",
    )
    lo.add_argument(
        "--explore", metavar="DIR",
        help="write the graph with partition, CPU and fusion overlays for Google's Model Explorer into DIR "
        "(needs edgeplug[explorer]); a --report ending in .html is a self-contained page instead of JSON",
    )


def cmd_zoo(args: argparse.Namespace) -> int:
    return zoo_command(args)


def _quiet_dependencies() -> None:
    """Keep torch/torchao/executorch chatter (deprecations, optional .so loads) off the terminal."""
    for category in (FutureWarning, DeprecationWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category)
    # not a library's chatter: a plugin's old spelling, named with its new one, for its author to see
    warnings.filterwarnings("default", category=PluginApiDeprecationWarning)
    # torch: here, not at the top, as `edgeplug --help` and `edgeplug plugins` start without it; it
    # configures its loggers on import, so they are adjusted after
    import torch  # noqa: F401

    for name in ("torchao", "torch", "executorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # fake tensors log the whole traceback of an op's failing meta function at ERROR, then raise it:
    # the error reaches the user once, as one line, through edgeplug's own message
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    # executorch's partitioners log progress on the root logger (and some modules call
    # basicConfig(level=INFO) on import): the terminal's handler takes warnings only. Not
    # logging.disable: that would also drop the DEBUG records a partitioner gives its reasons in,
    # which edgeplug reads for the report's CPU nodes (and it would outlive this call)
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.WARNING)  # a later basicConfig(level=INFO) is then a no-op
    for handler in root.handlers:
        handler.setLevel(max(handler.level, logging.WARNING))
    root.setLevel(logging.WARNING)


def _plugin_problems_as_lines() -> None:
    """A plugin problem (a broken ``EDGEPLUG_REGISTER_PLUGINS`` entry, a plugin that fails to import) is one
    ``edgeplug: warning:`` line on every command, ``-v`` or not: it is edgeplug's own message, naming the
    variable or plugin and the fix, not a library's chatter (``_quiet_dependencies`` drops UserWarnings)."""
    warnings.filterwarnings("default", category=PluginWarning)  # first in the list: before the ignores
    if getattr(warnings.showwarning, "edgeplug_lines", False):
        return
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001, ANN202 (warnings' signature)
        if issubclass(category, PluginWarning):
            say(f"edgeplug: warning: {message}")
        else:
            shown(message, category, filename, lineno, file, line)

    show.edgeplug_lines = True  # type: ignore[attr-defined]  # marks our hook, so it is installed once
    warnings.showwarning = show


def _stream_failed(exc: OSError) -> int:
    """stdout or stderr failed (closed pipe, full disk): say so if stderr still takes it, stop writing, give the code."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:  # nothing more may reach the broken stream, not even the interpreter's flush at exit
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                try:
                    os.dup2(devnull, stream.fileno())
                except (OSError, ValueError):
                    pass
        if exc.errno != errno.EPIPE:
            try:
                say(f"edgeplug: output failed: {exc.strerror or exc}", flush=True)
            except (OSError, ValueError):
                pass
    finally:
        os.close(devnull)
    return STREAM_ERRORS[exc.errno]


class Terminated(BaseException):
    """SIGTERM arrived (what `timeout` and CI cancellation send)."""


def _on_sigterm(signum: int, _frame: object) -> None:
    raise Terminated(signum)


#: what ``EDGEPLUG_DEBUG`` may say, case aside: on, or off (unset and empty are off)
_DEBUG_ON = ("1", "true", "yes", "on")
_DEBUG_OFF = ("", "0", "false", "no", "off")


def _debug_variable() -> bool:
    """Whether ``EDGEPLUG_DEBUG`` turns tracebacks on; a value that is neither on nor off is said in one line
    and taken as off (a traceback for the user's own error is what the variable must not bring by accident)."""
    value = os.environ.get(DEBUG_ENV, "")
    if value.strip().lower() in _DEBUG_ON:
        return True
    if value.strip().lower() not in _DEBUG_OFF:
        say(
            f"edgeplug: warning: {DEBUG_ENV}={value!r} is neither on ({', '.join(_DEBUG_ON)}) nor off "
            f"({', '.join(repr(v) for v in _DEBUG_OFF)}); tracebacks stay off: set {DEBUG_ENV}=1 (or pass --debug) for them"
        )
    return False


def _debugging(args: argparse.Namespace) -> bool:
    if getattr(args, "debug", False):
        return True
    if not hasattr(args, "debug_variable"):  # read once a command: its warning is one line
        args.debug_variable = _debug_variable()
    return args.debug_variable


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if not getattr(args, "verbose", False):
        _quiet_dependencies()
        if argv is None and args.fn is cmd_lower:  # the command itself: libraries' destructors print at exit
            silence_at_exit()
    _plugin_problems_as_lines()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    code = _run(args, previous)
    if argv is None and args.fn is cmd_lower:  # the command itself, not a test calling main()
        _end_without_waiting(code)
    return code


def _written_since(mark: int) -> str:
    """What this command wrote whole before it stopped (``edgeplug._outputs`` records each set it wrote)."""
    done = written_files()[mark:]
    if not done:
        return "nothing was written"
    return f"{', '.join(dict.fromkeys(done))} {'was' if len(done) == 1 else 'were'} written whole before it arrived"


def _run(args: argparse.Namespace, previous: Any) -> int:
    mark = len(written_files())
    try:
        return args.fn(args)
    except EdgeplugError as exc:
        _say_failure(args, exc, str(exc))
        # a write that failed for want of room (the disk, a quota, a file size limit) is the environment's
        return DISK_FULL_CODE if getattr(exc.__cause__, "errno", None) in DISK_FULL else 2
    except KeyboardInterrupt as exc:
        _say_failure(args, exc, f"interrupted; {_written_since(mark)}")
        return 130
    except Terminated as exc:
        _say_failure(args, exc, f"terminated (SIGTERM); {_written_since(mark)}")
        return 143
    except OSError as exc:
        if exc.errno not in STREAM_ERRORS:  # any other is not the terminal's: say so as below
            _say_failure(args, exc, f"unexpected {first_line(exc)}: this is a bug in edgeplug; please report it with --debug's traceback")
            return 2
        return _stream_failed(exc)
    except SystemExit as exc:  # argparse exits before this try: this one came from the model's (or a plugin's) code
        frame = user_frame(exc)
        where = f" at {_location(*frame)}" if frame else ""
        _say_failure(args, exc, f"the model's code called sys.exit({exc.code!r}){where} while edgeplug was lowering it; nothing was written")
        return 2
    except Exception as exc:
        gap = version_gap(exc)
        if gap is not None:
            _say_failure(args, exc, f"{gap}; nothing was written")
            return 2
        _say_failure(args, exc, f"unexpected {first_line(exc)}: this is a bug in edgeplug; please report it with --debug's traceback")
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _end_without_waiting(code: int) -> None:
    """The command is done: a thread the model's code left running (said when it was found) does not keep
    the process alive. Exit handlers run, streams are flushed, then the process ends with ``code``."""
    if not left_running():
        return
    for s in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            s.flush()
    atexit._run_exitfuncs()
    os._exit(code)


def _say_failure(args: argparse.Namespace, exc: BaseException, message: str) -> None:
    if _debugging(args):
        printed = getattr(exc, "model_output", "")
        if printed:  # what the model file printed while -v was off
            say(f"the model file printed, while edgeplug held it off the terminal:\n{printed.rstrip()}")
        hidden = getattr(exc, "hidden_output", "")
        if hidden:  # what the libraries printed while -v was off
            say(f"the libraries printed, while edgeplug kept it off the terminal:\n{hidden.rstrip()}")
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        partial = getattr(root_cause(exc), "partial_fx_graph", None)
        if partial:
            say(f"the graph torch.export had captured when it failed:\n{partial}")
    stage = getattr(exc, "lowering_stage", None)
    if stage and not message.startswith("stage "):
        message = f"stage {stage!r}: {message}"
    first, *rest = message.splitlines() or [""]
    err(first)
    for line in rest:
        say(f"  {line}")
