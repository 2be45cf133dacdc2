"""`edgeplug` command line: backends, examples, lower."""

from __future__ import annotations

import argparse
import errno
import os
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from edgeplug._errors import EdgeplugError


DEBUG_ENV = "EDGEPLUG_DEBUG"


def _err(msg: str) -> None:
    print(f"edgeplug: error: {msg}", file=sys.stderr)


def cmd_backends(args: argparse.Namespace) -> int:
    from edgeplug._backend import resolve_backend
    from edgeplug._plugins import manager

    m = manager()
    specs = m.backend_specs()
    rows = [("backend", "distribution", "version", "verify", "serializes here")]
    for name in sorted(specs):
        b = resolve_backend(m, name)
        a = b.availability()
        avail = "yes" if a.ok else f"no: {a.reason}"
        if a.ok and not args.no_probe:  # a partitioner that cannot be built makes every lowering fail: say so here
            broken = probe_partitioner(b)
            avail = f"no: {broken}" if broken else avail
        rows.append((name, b.distribution, b.version, b.spec.verify_method, avail))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
    kernels = any(spec.verify_method == "kernels" for _, spec in specs.values())
    if specs and (args.adapter or (kernels and not args.no_adapter)):
        try:
            from edgeplug._runtime import adapter_summary

            print(f"\nwgpu adapter: {adapter_summary()}")
        except Exception as exc:  # runtime is optional here
            print(f"\nwgpu adapter: none ({exc})")
    _print_plugin_trouble(m)
    if specs:
        return 0
    if m.problems() or m.conflicts():
        _err("no backend is available: every installed plugin that registers one failed (see above)")
    elif m.skipped():
        _err("no backend is available: every plugin is skipped (see above)")
    else:
        _err("no backends installed: install a backend plugin, e.g. pip install edgeplug-xnnpack (or -vulkan, -webgpu, -qnn, -samsung)")
    return 1


#: how long ``edgeplug backends`` waits for one partitioner factory
PROBE_SECONDS = 30.0


def probe_partitioner(backend: object, seconds: float = PROBE_SECONDS) -> str:
    """Build the backend's partitioner once: '' if it builds, else why not (its error, or a timeout)."""
    from edgeplug._registry import TimeLimit, failure, time_limit

    import contextlib
    import io

    factory = backend.spec.partitioner
    try:  # what the SDK prints while it imports is noise here: the row says what matters
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            with time_limit(seconds, f"the partitioner factory of backend {backend.name!r}"):
                made = factory()
    except TimeLimit as exc:
        return str(exc)
    except Exception as exc:  # the user sees which plugin, where, and the cause
        return f"its partitioner factory (BackendSpec.partitioner) raised {failure(exc, backend.plugin)}"
    if not callable(getattr(made, "partition", None)):
        return (
            f"its partitioner factory (BackendSpec.partitioner) returned {type(made).__name__}, "
            "not an executorch Partitioner (an object with .partition(exported_program))"
        )
    return ""


def _print_plugin_trouble(m) -> None:
    """Broken and skipped plugins, unavailable backends and ignored records, on stderr."""
    for p in m.problems():
        print(f"\nbroken plugin: {p.message}", file=sys.stderr)
    for c in m.conflicts():
        print(f"\nunavailable backend: {c.message}", file=sys.stderr)
    for u in m.unclaimed():
        print(f"\nignored record: {u.message}", file=sys.stderr)
    for info, why in m.skipped():
        print(f"skipped plugin {info.name!r} ({info.distribution}): {why}", file=sys.stderr)


def cmd_plugins(args: argparse.Namespace) -> int:
    """Each plugin: distribution, version, entry point, status, and what it adds to which backend."""
    import json

    from edgeplug._plugins import manager
    from edgeplug._registry import summaries

    found = summaries(manager())
    if args.json:
        print(json.dumps([
            {
                "plugin": s.plugin.name, "distribution": s.plugin.distribution, "version": s.plugin.version,
                "entry_point": s.plugin.entry_point, "status": s.status, "reason": s.reason,
                "contributes": s.contributes, "trouble": s.trouble,
            }
            for s in found
        ], indent=2))
        return 0
    if not found:
        print("no edgeplug plugins installed: install a backend plugin, e.g. pip install edgeplug-xnnpack")
        return 0
    for s in found:
        status = s.status if not s.reason else f"{s.status}: {s.reason}"
        print(f"{s.plugin.name}: {s.plugin.distribution} {s.plugin.version}".rstrip())
        print(f"  entry point  {s.plugin.entry_point}")
        print(f"  status       {status}")
        for backend, what in sorted(s.contributes.items()):
            print(f"  adds to backend {backend!r}" + (f" ({s.trouble[backend]})" if backend in s.trouble else ""))
            for phrase in what:
                print(f"    {phrase}")
    return 0


def cmd_new_backend(args: argparse.Namespace) -> int:
    """Write a plugin package with every hook stubbed, its pyproject, and a conformance test."""
    from edgeplug._scaffold import write

    root = write(args.name, args.output, partitioner=args.partitioner, backend_id=args.backend_id)
    print(f"wrote {root}")
    print(f"next: pip install -e '{root}[test]' && edgeplug plugins && (cd {root} && pytest)")
    return 0


def cmd_examples(args: argparse.Namespace) -> int:
    from edgeplug.examples import list_examples

    for name, desc in list_examples().items():
        print(f"{name:<14} {desc}")
    return 0


def _tolerance(text: str) -> float:
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the tolerance must be a finite number >= 0")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give at least 1")
    return value


def _default_output(spec: str, backend: str) -> Path:
    return Path(f"{Path(spec).stem.replace(':', '_')}-{backend}.pte")


def _in_folder(given: Optional[str], default: Path) -> Optional[str]:
    """``out/`` (a trailing slash names a folder): ``default``'s name inside it."""
    from edgeplug._outputs import names_a_folder

    if given is not None and names_a_folder(given):
        return os.path.join(given, default.name)
    return given


def _input_files(args: argparse.Namespace) -> dict[str, Optional[str]]:
    """The files this run reads, which no output may replace."""
    out: dict[str, Optional[str]] = {}
    for what, spec in (("the model file", args.model), ("the calibration file", args.calibration)):
        if spec and ":" in spec:
            out[what] = spec.rsplit(":", 1)[0]
        elif spec and spec.endswith(".py"):
            out[what] = spec
    return out


def _is_stdout(path: object) -> bool:
    """``-``, or a path naming the file stdout is (``/dev/stdout``)."""
    if path is None:
        return False
    if os.fspath(path) == "-":
        return True
    try:
        a, b = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _check_before_work(args: argparse.Namespace, backend: object) -> Path:
    """What can be refused before a minute is spent on export: the SDK, the flags, every output path."""
    from edgeplug._outputs import check_output_paths

    if args.verify and not args.dry_run:
        from edgeplug._verify import refuse_verify_without_runtime

        refuse_verify_without_runtime(backend)
    if not args.dry_run:
        backend.require_available()
    if args.calibration and not args.quantize:
        raise EdgeplugError("--calibration needs --quantize SCHEME (calibration data is for quantizing)")
    if args.calibration_batches is not None and not args.quantize:
        raise EdgeplugError("--calibration-batches needs --quantize SCHEME (it caps the calibration data)")
    if args.calibration_batches is None:
        from edgeplug._quantization import DEFAULT_CALIBRATION_BATCHES

        args.calibration_batches = DEFAULT_CALIBRATION_BATCHES
    default = _default_output(args.model, backend.name)
    args.output = _in_folder(args.output, default)
    args.report = _in_folder(args.report, default.with_suffix(".json"))
    out = Path(args.output) if args.output and args.output != "-" else (args.output or default)
    check_output_paths(
        {"the .pte": None if args.dry_run else out, "the report": args.report},  # a dry run writes no .pte
        inputs=_input_files(args),
    )
    return out


def _write_outputs(args: argparse.Namespace, result: object, out: Path, failed: bool) -> None:
    from edgeplug._outputs import write_file

    try:
        if args.dry_run or failed:
            if args.report:
                write_file(args.report, result.report.to_json())
        else:
            result.save(out, report=args.report)
    except OSError as exc:
        if _is_stdout(exc.filename) and exc.errno in _STREAM_ERRORS:
            raise  # stdout is the environment's: main() ends quietly with the error's own code
        raise EdgeplugError(f"cannot write {exc.filename or out}: {exc.strerror or exc}; nothing was written") from exc


def _check_views(args: argparse.Namespace) -> None:
    """``--report X.html`` and ``--explore DIR``, refused before any work when they cannot be written."""
    from edgeplug._report_html import is_html

    args.html_report = None
    if is_html(args.report):  # the page is written by _write_views, the JSON writer skips it
        args.html_report, args.report = args.report, None
    if args.explore:
        _check_explore_dir(args.explore)


def _check_explore_dir(folder: str) -> None:
    from edgeplug._explorer import _model_explorer

    if os.path.exists(folder) and not os.path.isdir(folder):
        raise EdgeplugError(f"--explore {folder}: that is a file; give a folder (it is created if missing)")
    _model_explorer()  # not installed: said now, not after the lowering


def _compare_stock(report: object, model: object, inputs: tuple, backend: object, progress) -> None:
    from edgeplug._report_html import stock_partitioning

    progress(f"[{backend.name}] stock executorch flow, for --compare-stock ...")
    report.stock = stock_partitioning(model, inputs, backend)
    if report.stock.error:
        report.notes.append(f"--compare-stock: {report.stock.error}")


def _write_views(args: argparse.Namespace, report: object) -> None:
    """The HTML page and the Model Explorer files, after the .pte and the JSON report."""
    from edgeplug._report_html import write_report

    try:
        if getattr(args, "html_report", None):
            write_report(args.html_report, report)
            print(f"wrote report {args.html_report}", file=sys.stderr)
        if getattr(args, "explore", None):
            from edgeplug._explorer import explorer_command, write_explorer

            paths = write_explorer(report, args.explore)
            print(f"wrote Model Explorer files in {args.explore}: open them with\n  {explorer_command(paths)}", file=sys.stderr)
    except OSError as exc:
        raise EdgeplugError(f"cannot write {exc.filename or args.explore}: {exc.strerror or exc}") from exc


def cmd_report(args: argparse.Namespace) -> int:
    """Print a saved report's table; with --html / --explore, write the page or Model Explorer's files."""
    from edgeplug._outputs import check_output_paths
    from edgeplug._report_html import load_report

    if args.html and os.path.abspath(args.html) == os.path.abspath(args.report):
        raise EdgeplugError(f"--html {args.html} would replace the report it reads: give another path")
    check_output_paths({"the HTML page": args.html})
    if args.explore:
        _check_explore_dir(args.explore)
    report = load_report(args.report)
    print(report.to_table())
    args.html_report = args.html
    _write_views(args, report)
    return 0


def cmd_lower(args: argparse.Namespace) -> int:
    from edgeplug._plugins import get_backend
    from edgeplug.examples import load_model
    from edgeplug._pipeline import lower

    start = time.perf_counter()

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"{time.perf_counter() - start:7.1f}s {msg}", file=sys.stderr, flush=True)

    backend = get_backend(args.backend)
    out = _check_before_work(args, backend)
    _check_views(args)
    model, inputs, kwargs, label = load_model(args.model, progress=progress)
    if args.quantize:  # the backend's own quantizer, before lowering (edgeplug._quantization)
        from edgeplug._quantization import load_calibration, quantize

        limit = args.calibration_batches
        calibration = load_calibration(args.calibration, limit) if args.calibration else None
        model = quantize(
            model, inputs, backend, args.quantize, calibration, kwargs=kwargs, progress=progress,
            calibration_batches=limit,
        )
    result = lower(
        model, inputs, backend, kwargs=kwargs, verify=args.verify, dry_run=args.dry_run, model_name=label,
        progress=progress, tolerance=args.tolerance,
    )
    report, v = result.report, result.report.verification
    if args.compare_stock:
        _compare_stock(report, model, inputs, backend, progress)
    failed = v is not None and not v.passed
    if args.dry_run and args.output:
        report.notes.append(f"--dry-run: {out} was not written")
    elif failed:
        report.notes.append(f"verification failed: {out} was not written")
    _write_outputs(args, result, out, failed)
    _write_views(args, report)
    # stdout carries the .pte or the report when one of them is "-": the table goes to stderr then
    table_to = sys.stderr if any(_is_stdout(p) for p in (out, args.report)) else sys.stdout
    print(report.to_table(), file=table_to)
    if args.report:
        print(f"wrote report {args.report}", file=table_to)
    if failed:
        _err(f"verification failed: {' | '.join(v.failures())}; no .pte was written")
        return 3
    return 0


def installed_schemes() -> str:
    """'qnn: 16a8w, 8a8w; xnnpack: 8a8w': the quantization schemes of the backends installed here."""
    try:
        from edgeplug._plugins import manager
        from edgeplug._records import QuantScheme

        m = manager()
        available = m.backend_specs()
        by_backend: dict[str, list[str]] = {}
        for c in m.contributions(QuantScheme):
            if c.record.backend in available:
                by_backend.setdefault(c.record.backend, []).append(c.record.scheme)
    except Exception as exc:  # help must print even when plugins cannot be read
        return f"the installed backends' schemes could not be read: {exc}"
    if not by_backend:
        return "no installed backend declares a scheme"
    return "installed: " + "; ".join(f"{b}: {', '.join(schemes)}" for b, schemes in sorted(by_backend.items()))


class _LowerHelp(argparse.HelpFormatter):
    """Fills in ``{schemes}`` when help is printed, so only ``--help`` loads the plugins to list them."""

    def _get_help_string(self, action: argparse.Action) -> Optional[str]:
        text = action.help or ""
        return text.replace("{schemes}", installed_schemes()) if "{schemes}" in text else text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgeplug", description="Lower PyTorch models to ExecuTorch backends through plugins.")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("backends", help="list installed backends")
    b.add_argument("--adapter", action="store_true", help="name the wgpu adapter even if no backend verifies with kernels")
    b.add_argument("--no-adapter", action="store_true", help="do not look for a wgpu adapter")
    b.add_argument(
        "--no-probe", action="store_true",
        help="do not build each available backend's partitioner once to check it (faster: no SDK is imported)",
    )
    b.set_defaults(fn=cmd_backends)
    pl = sub.add_parser("plugins", help="list plugins: distribution, entry point, status, what each adds to which backend")
    pl.add_argument("--json", action="store_true", help="print the listing as JSON")
    pl.set_defaults(fn=cmd_plugins)
    nb = sub.add_parser("new-backend", help="write a plugin package for a new backend (every hook stubbed, a conformance test)")
    nb.add_argument("name", help="the backend's name (lower-case; the package is edgeplug_NAME)")
    nb.add_argument(
        "--partitioner", default="xnnpack",
        help="executorch partitioner underneath: xnnpack (default), vulkan, or MODULE:CLASS",
    )
    nb.add_argument("--backend-id", help="the id the partitioner tags partitions with (needed with MODULE:CLASS)")
    nb.add_argument("-o", "--output", default=".", help="folder to write edgeplug-NAME/ in (default: here)")
    nb.set_defaults(fn=cmd_new_backend)
    e = sub.add_parser("examples", help="list built-in example models")
    e.set_defaults(fn=cmd_examples)
    rp = sub.add_parser("report", help="show a saved JSON report, or turn it into an HTML page or Model Explorer files")
    rp.add_argument("report", help="a JSON report `edgeplug lower --report X.json` wrote")
    rp.add_argument("--html", metavar="OUT.html", help="write the report as one self-contained HTML page here")
    rp.add_argument("--explore", metavar="DIR", help="write the graph and its overlays for Model Explorer into DIR")
    rp.set_defaults(fn=cmd_report)
    lo = sub.add_parser("lower", help="lower a model for a backend and write a .pte", formatter_class=_LowerHelp)
    lo.add_argument(
        "model",
        help="a built-in example name, or FILE.py:ATTR: FILE.py is executed (as `python FILE.py` would, "
        "its folder on sys.path) and ATTR called to return (model, args) or (model, args, kwargs)",
    )
    lo.add_argument("--backend", "-b", required=True)
    lo.add_argument(
        "-o", "--output",
        help="where to write the .pte (default: MODEL-BACKEND.pte): a file, a folder (FOLDER/), or - for stdout; "
        "a FIFO or device is written in place; nothing but a regular file is ever replaced, never an input",
    )
    lo.add_argument("--report", help="also write the report as JSON here (a file, FOLDER/, or -)")
    lo.add_argument("--verify", action="store_true", help="run the lowered program and compare with eager")
    lo.add_argument(
        "--tolerance", type=_tolerance, default=None,
        help="max |difference| --verify accepts, a finite number >= 0 (default: by output dtype, "
        "1e-4 for fp32, a few ulps of the output's magnitude for fp16/bf16)",
    )
    lo.add_argument("--dry-run", action="store_true", help="partition and report; write no .pte")
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
    lo.add_argument(
        "--calibration-batches", metavar="N", type=_positive_int, default=None,
        help="read at most N calibration batches (default: 100); the report counts them and says when there were more",
    )
    lo.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    lo.add_argument("-v", "--verbose", action="store_true", help="keep the warnings and logs of torch/executorch")
    lo.add_argument("--debug", action="store_true", help=f"on an error, print its traceback too (or set {DEBUG_ENV}=1)")
    lo.set_defaults(fn=cmd_lower)
    from edgeplug._zoo._cli import add_arguments as add_zoo_arguments  # argparse only: no torch

    zo = sub.add_parser("zoo", help="lower a model set x backends x schemes, each cell in its own process (local or Ray)")
    add_zoo_arguments(zo)
    zo.set_defaults(fn=cmd_zoo)
    return p


def cmd_zoo(args: argparse.Namespace) -> int:
    from edgeplug._zoo._cli import command

    return command(args)


def _quiet_dependencies() -> None:
    """Keep torch/torchao/executorch chatter (deprecations, optional .so loads) off the terminal."""
    import logging
    import warnings

    for category in (FutureWarning, DeprecationWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category)
    import torch  # noqa: F401  (torch configures its loggers on import; adjust after)

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


#: errors writing to stdout/stderr that are the environment's, and the exit code each ends with
_STREAM_ERRORS = {errno.EPIPE: 141, errno.ENOSPC: 74, errno.EIO: 74, errno.EDQUOT: 74, errno.EFBIG: 74}


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
                print(f"edgeplug: output failed: {exc.strerror or exc}", file=sys.stderr, flush=True)
            except (OSError, ValueError):
                pass
    finally:
        os.close(devnull)
    return _STREAM_ERRORS[exc.errno]


class Terminated(BaseException):
    """SIGTERM arrived (what `timeout` and CI cancellation send)."""


def _on_sigterm(signum: int, _frame: object) -> None:
    raise Terminated(signum)


def _debugging(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def main(argv: Optional[Sequence[str]] = None) -> int:
    import signal
    import threading

    args = build_parser().parse_args(argv)
    if not getattr(args, "verbose", False):
        _quiet_dependencies()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return args.fn(args)
    except EdgeplugError as exc:
        _fail(args, exc, str(exc))
        return 2
    except KeyboardInterrupt as exc:
        _fail(args, exc, "interrupted; nothing was written")
        return 130
    except Terminated as exc:
        _fail(args, exc, "terminated (SIGTERM); nothing was written")
        return 143
    except OSError as exc:
        if exc.errno not in _STREAM_ERRORS:  # any other is not the terminal's: say so as below
            from edgeplug._failures import first_line

            _fail(args, exc, f"unexpected {first_line(exc)}: this is a bug in edgeplug; please report it with --debug's traceback")
            return 2
        return _stream_failed(exc)
    except SystemExit as exc:  # argparse exits before this try: this one came from the model's (or a plugin's) code
        _fail(args, exc, f"the model's code called sys.exit({exc.code!r}) while edgeplug was lowering it; nothing was written")
        return 2
    except Exception as exc:
        from edgeplug._failures import first_line

        _fail(args, exc, f"unexpected {first_line(exc)}: this is a bug in edgeplug; please report it with --debug's traceback")
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _fail(args: argparse.Namespace, exc: BaseException, message: str) -> None:
    if _debugging(args):
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        from edgeplug._failures import root_cause

        partial = getattr(root_cause(exc), "partial_fx_graph", None)
        if partial:
            print(f"the graph torch.export had captured when it failed:\n{partial}", file=sys.stderr)
    stage = getattr(exc, "lowering_stage", None)
    if stage and not message.startswith("stage "):
        message = f"stage {stage!r}: {message}"
    first, *rest = message.splitlines() or [""]
    _err(first)
    for line in rest:
        print(f"  {line}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
