"""`edgeplug lower` and `edgeplug report`: lower a model, check outputs before any work, write the .pte,
the report and its views (HTML, Model Explorer)."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from edgeplug import examples
from edgeplug._api import model_renames
from edgeplug._cli.common import STREAM_ERRORS, err, say
from edgeplug._cli.quiet import native_output_hidden
from edgeplug._backend import Backend
from edgeplug._errors import EdgeplugError
from edgeplug._explorer import _model_explorer, explorer_command, write_explorer
from edgeplug._outputs import check_output_paths, names_a_folder, write_file
from edgeplug._facade import backends_with_quantizers
from edgeplug._registry.lookup import get_backend, manager
from edgeplug._quantize.quantize import DEFAULT_CALIBRATION_BATCHES, load_calibration, no_quantizer, quant_scheme, quantize_for_backend
from edgeplug._records import QuantScheme
from edgeplug._report.records import LoweringReport, stand_in_path
from edgeplug._report.html import is_html, load_report, write_report
from edgeplug._stock import stock_partitioning
from edgeplug._user_code import Effects, contained, torch_defaults_lines

if TYPE_CHECKING:  # the names only: _pipeline loads torch and executorch, once a lowering is asked for
    from edgeplug._pipeline import Prepared
    from edgeplug._result import LoweringResult

#: an output as the command line names it: a path, or "-" for stdout
PathLike = str | os.PathLike[str]


def tolerance_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the tolerance must be a finite number >= 0")
    return value


def positive_int_arg(text: str) -> int:
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


def _is_stdout(path: Optional[PathLike]) -> bool:
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


def _check_before_work(args: argparse.Namespace, backend: Backend) -> tuple[Path, Prepared]:
    """What can be refused before a minute is spent on export: the SDK, the flags, every output path.
    The lowering's flags are read once, by ``prepare`` (which builds the backend's partitioner, so a
    factory that raises, a missing SDK module, fails here); the lowering then runs with what it settled."""
    # torch, executorch (and _weights below): loaded only once a lowering is asked for
    from edgeplug._pipeline import prepare

    prepared = prepare(
        backend, verify=args.verify, verify_steps=args.verify_steps, tolerance=args.tolerance, dry_run=args.dry_run,
        external_weights=args.external_weights, etrecord=args.etrecord,
    )
    if args.calibration and not args.quantize:
        raise EdgeplugError("--calibration needs --quantize SCHEME (calibration data is for quantizing)")
    if args.calibration_batches is not None and not args.quantize:
        raise EdgeplugError("--calibration-batches needs --quantize SCHEME (it caps the calibration data)")
    if args.quantize:  # an unknown scheme is known before the model file runs
        if not backend.records(QuantScheme):
            raise no_quantizer(backend, backends_with_quantizers())
        quant_scheme(backend, args.quantize)
    if args.calibration_batches is None:
        args.calibration_batches = DEFAULT_CALIBRATION_BATCHES
    default = _default_output(args.model, backend.name)
    args.output = _in_folder(args.output, default)
    args.report = _in_folder(args.report, default.with_suffix(".json"))
    out = Path(args.output) if args.output and args.output != "-" else (args.output or default)
    if args.write_stand_in and out == "-":
        raise EdgeplugError("--write-stand-in writes STEM.stand-in.pte, a file: give -o FILE.pte, not -")
    targets = {"the .pte": None if args.dry_run else out, "the report": args.report}  # a dry run writes no .pte
    if args.write_stand_in:  # where a program with stand-in delegates would go (a dry run's, or a backend's)
        targets["the stand-in .pte"] = stand_in_path(out)
    if args.external_weights and not args.dry_run:  # the .ptd beside the .pte: both, or neither (save checks again)
        from edgeplug._weights import check_weights_target  # torch: as _pipeline above

        targets["the weights (.ptd)"] = check_weights_target(out)
    if args.etrecord:
        targets["the ETRecord"] = args.etrecord
    check_output_paths(targets, inputs=_input_files(args))
    return out, prepared


def _not_written(out: PathLike) -> str:
    if out == "-":
        return "nothing was written to stdout (--write-stand-in writes the program to -o FILE as FILE.stand-in.pte)"
    return f"{out} was not written (--write-stand-in writes it as {stand_in_path(out)})"


def _write_outputs(args: argparse.Namespace, result: LoweringResult, out: Path, failed: bool) -> None:
    try:
        held = result.report.stand_in
        if held is not None and args.write_stand_in and not failed:
            result.save(out, report=args.report, stand_in=True)  # as STEM.stand-in.pte, never as `out`
        elif args.dry_run or failed or held is not None:
            if args.report:
                write_file(args.report, result.report.to_json())
        else:
            result.save(out, report=args.report)
    except OSError as exc:
        if _is_stdout(exc.filename) and exc.errno in STREAM_ERRORS:
            raise  # stdout is the environment's: main() ends quietly with the error's own code
        raise EdgeplugError(f"cannot write {exc.filename or out}: {exc.strerror or exc}; nothing was written") from exc


def _check_views(args: argparse.Namespace) -> None:
    """``--report X.html`` and ``--explore DIR``, refused before any work when they cannot be written."""
    args.html_report = None
    if is_html(args.report):  # the page is written by _write_views, the JSON writer skips it
        args.html_report, args.report = args.report, None
    if args.explore:
        _check_explore_dir(args.explore)


def _check_explore_dir(folder: str) -> None:
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise EdgeplugError(f"--explore {folder}: that is a file; give a folder (it is created if missing)")
    _model_explorer()  # not installed: said now, not after the lowering


def _compare_stock(report: LoweringReport, model: Any, inputs: tuple, backend: Backend, progress: Any) -> None:
    progress(f"[{backend.name}] stock executorch flow, for --compare-stock ...")
    report.stock = stock_partitioning(model, inputs, backend)
    if report.stock.error:
        report.notes.append(f"--compare-stock: {report.stock.error}")


def _write_views(args: argparse.Namespace, report: LoweringReport) -> None:
    """The HTML page and the Model Explorer files, after the .pte and the JSON report."""
    try:
        if getattr(args, "html_report", None):
            write_report(args.html_report, report)
            say(f"wrote report {args.html_report}")
        if getattr(args, "explore", None):
            paths = write_explorer(report, args.explore)
            say(f"wrote Model Explorer files in {args.explore}: open them with\n  {explorer_command(paths)}")
    except OSError as exc:
        raise EdgeplugError(f"cannot write {exc.filename or args.explore}: {exc.strerror or exc}") from exc


def _say_effects(effects: Effects, progress, who: str = "the model file") -> None:
    """One line for each thing the model (or calibration) file did to the process (``edgeplug._user_code``)."""
    if effects.chdir is not None:
        folder, where = effects.chdir
        say(
            f"edgeplug: warning: {who} changed the working folder to {folder}"
            f"{f' at {where}' if where else ''}; edgeplug went back to {os.getcwd()}, where the outputs are "
            f"written (open files relative to {who}: os.path.dirname(__file__))",
        )
    for thread, where in effects.threads:
        say(
            f"edgeplug: warning: {who} started thread {thread.name!r}{f' at {where}' if where else ''} "
            "and left it running; edgeplug does not wait for it when it ends (join it before returning, or "
            "start it with daemon=True)",
        )
    for line in torch_defaults_lines(effects, who):
        say(f"edgeplug: warning: {line}")
    lines = effects.printed_lines()
    if lines:
        progress(f"{who} printed {lines:,} line{'s' if lines != 1 else ''}, held off the terminal (-v shows them)")


def cmd_report(args: argparse.Namespace) -> int:
    """Print a saved report's table; with --html / --explore, write the page or Model Explorer's files."""
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
    if args.verify_steps is not None:  # a mode of --verify: it implies it
        args.verify = True
    _say_deprecated_model_name(args.model)
    progress = _progress_printer(args.quiet)
    backend = get_backend(args.backend)
    with contextlib.nullcontext() if args.verbose else native_output_hidden():  # a partitioner factory may print
        out, prepared = _check_before_work(args, backend)
    _check_views(args)
    # without -v, what native libraries print (a vendor SDK's log, executorch's C++ log) stays off the terminal
    with contextlib.nullcontext() if args.verbose else native_output_hidden():
        result = _load_and_lower(args, prepared, progress)
    report, v = result.report, result.report.verification
    failed = v is not None and not v.passed
    report.notes.extend(_unwritten_notes(args, report, out, failed))
    _write_outputs(args, result, out, failed)
    _write_views(args, report)
    _say_what_was_written(args, report, out)
    if failed:
        err(f"verification failed: {' | '.join(v.failures())}; no .pte was written")
        return 3
    return 0


def _say_deprecated_model_name(name: str) -> None:
    """A deprecated short model name (``edgeplug._api.RENAMES``, kind "model"): one line on stderr naming the
    registry name to write; once its API is gone, an error saying the same."""
    rename = model_renames("edgeplug lower").get(name)
    if rename is None:
        return
    if rename.removed:
        raise EdgeplugError(rename.model_notice())
    say(f"edgeplug: deprecated: {rename.model_notice()}", flush=True)


def _progress_printer(quiet: bool):
    """``progress(msg)``: one line on stderr, with the seconds since the command started (none with -q)."""
    start = time.perf_counter()

    def progress(msg: str) -> None:
        if not quiet:
            say(f"{time.perf_counter() - start:7.1f}s {msg}", flush=True)

    return progress


def _load_and_lower(args: argparse.Namespace, prepared: Prepared, progress: Any) -> LoweringResult:
    """The model file run, the model quantized (--quantize) and lowered with what ``prepare`` settled, and the
    stock flow beside it (--compare-stock)."""
    from edgeplug._pipeline import lower_prepared  # torch, executorch: only when lowering

    backend = prepared.backend
    effects = Effects()
    try:
        model, inputs, kwargs, label = examples.load_model(
            args.model, progress=progress, effects=effects, hold_output=not args.verbose
        )
    finally:
        _say_effects(effects, progress)
    if args.quantize:  # the backend's own quantizer, before lowering (edgeplug._quantize.quantize)
        limit = args.calibration_batches
        calibration = _calibration_data(args, limit, progress) if args.calibration else None
        model = quantize_for_backend(
            model, inputs, backend, args.quantize, calibration, kwargs=kwargs, progress=progress,
            calibration_batches=limit,
        )
    result = lower_prepared(
        prepared, model, inputs, kwargs=kwargs, model_name=label, progress=progress,
        profile_memory=args.profile_memory, keep_stand_in=args.write_stand_in,
    )
    if args.compare_stock:
        _compare_stock(result.report, model, inputs, backend, progress)
    return result


def _calibration_data(args: argparse.Namespace, limit: int, progress) -> list[tuple]:
    """The calibration file run as the model file is (``edgeplug._user_code.contained``): its prints held, a
    change of folder or of torch's defaults undone, each said in one line."""
    effects = Effects()
    try:
        with contained(effects, hold_output=not args.verbose):
            return load_calibration(args.calibration, limit)
    finally:
        _say_effects(effects, progress, "the calibration file")


def _unwritten_notes(args: argparse.Namespace, report: LoweringReport, out: PathLike, failed: bool) -> list[str]:
    """The note that says why the .pte was not written, where it was not."""
    held = report.stand_in
    if held is not None and held.kind == "backend" and not args.write_stand_in:
        return [_not_written(out)]
    if args.dry_run and args.output and not args.write_stand_in:
        return [f"--dry-run: {out} was not written"]
    if failed:
        return [f"verification failed: {out} was not written"]
    return []


def _say_what_was_written(args: argparse.Namespace, report: LoweringReport, out: PathLike) -> None:
    """The not-runnable line for stand-in delegates, then the table and where the report went."""
    held = report.stand_in
    if held is not None and (held.kind == "backend" or args.write_stand_in):
        # the one line that says what this lowering is, wherever the table goes
        done = f"wrote it as {held.written}" if held.written else _not_written(out)
        say(f"edgeplug: not runnable: {held.reason}; {done}")
    # stdout carries the .pte or the report when one of them is "-": the table goes to stderr then
    table_to = sys.stderr if any(_is_stdout(p) for p in (out, args.report)) else sys.stdout
    print(report.to_table(), file=table_to)
    if args.report:
        say(f"wrote report {args.report}", file=table_to)


def installed_schemes() -> str:
    """'qnn: 16a8w, 8a8w; xnnpack: 8a8w': the quantization schemes of the backends installed here."""
    try:
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
