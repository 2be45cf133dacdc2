"""``edgeplug zoo``: the command's arguments and what it does with them (``edgeplug._zoo.run`` underneath)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from edgeplug._errors import EdgeplugError
from edgeplug._outputs import check_output_paths, is_stream, write_file
from edgeplug._terminal import terminal_safe


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive number, not {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, not {text!r}")
        return value

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--models", action="append", metavar="LIST",
        help="comma-separated: built-in zoo names (llama, qwen3, gemma3, ...; default: the built-in zoo but jamba), "
        "their registry names (transformers-llama) or transformers classes (LlamaForCausalLM), any other "
        "registry model (handwritten-llama-decoder, ...: `edgeplug examples` lists them), FILE.py:FUNCTION "
        "(returning (model, args) or (model, args, kwargs)), or @FILE listing them; may repeat",
    )
    p.add_argument("--backends", metavar="LIST", help="comma-separated (default: every installed backend)")
    p.add_argument(
        "--schemes", metavar="LIST",
        help="comma-separated: float and quantization schemes (default: float and each backend's own schemes); "
        "SCHEME@OWNER lowers backend OWNER's scheme for each chosen backend that has no SCHEME of its own",
    )
    p.add_argument("--compare-stock", action="store_true",
                   help="also lower each cell with the backend's own executorch partitioner (quantized cells: quantized "
                   "with the same quantizer, as executorch alone does), in the same process")
    p.add_argument("--jobs", "-j", type=_positive(int), default=1, help="cells at a time (default 1)")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local processes (default), or a Ray task per cell (needs edgeplug[ray])")
    p.add_argument("--address", help="the Ray cluster to use (default: start a local one of --jobs CPUs)")
    p.add_argument("--timeout", type=_positive(float), default=600.0, metavar="S",
                   help="seconds a cell's process may run, start-up included (default 600)")
    p.add_argument("--memory-limit", type=_positive(int), default=None, metavar="MB",
                   help="memory a cell's process may allocate (RLIMIT_DATA; default: no limit)")
    p.add_argument("--retries", type=int, default=2,
                   help="times a cell whose process or worker was killed is started again (default 2)")
    p.add_argument("--out", "-o", metavar="CELLS.jsonl", help="append each finished cell here as a JSON line")
    p.add_argument("--resume", action="store_true", help="run only the cells --out does not hold yet")
    p.add_argument("--markdown", metavar="FILE.md", help="write the Markdown docs/zoo.md is made of here")
    p.add_argument("--layers", type=_positive(int), default=None,
                   help="layers of every built-in model (default: each config's 2)")
    p.add_argument("--repeat", type=_positive(int), default=1,
                   help="lower each side this many times (alternating) and keep each side's fastest time")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")


def command_line(args: argparse.Namespace) -> str:
    """The ``edgeplug zoo`` command that gives ``args`` (what docs/zoo.md says it was made with)."""
    defaults = vars(zoo_parser().parse_args([]))
    words = ["edgeplug", "zoo"]
    for name, value in vars(args).items():
        if name not in defaults or value == defaults[name] or name in ("quiet", "out", "resume"):
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            words.append(flag)
        else:
            for item in value if isinstance(value, list) else [value]:
                words += [flag, str(item)]
    return shlex.join(words)


def zoo_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgeplug zoo")
    add_arguments(p)
    return p


def _check_outputs(args: argparse.Namespace) -> None:
    """Before any cell runs: --out and --markdown by lower's output rules (a folder, an unwritable
    place, the same file twice, a model file or model list), and --markdown holds no other text than a
    zoo page (it is rewritten)."""
    from edgeplug._zoo._models import resolve_models  # torch: as in command

    inputs = [("the model list", e.strip()[1:]) for raw in args.models or [] for e in raw.split(",")
              if e.strip().startswith("@")]
    inputs += [("the model file", key.rsplit(":", 1)[0]) for key in resolve_models(args.models) if ":" in key]
    outputs = {"the results file (--out)": args.out, "the Markdown page (--markdown)": args.markdown}
    check_output_paths(outputs)
    for what, path in inputs:
        check_output_paths(outputs, inputs={what: path})
    if args.markdown:
        _page(args.markdown)


def _page(path: str) -> str:
    """The zoo page at ``path`` ("" where there is none); refuses a file that holds anything else."""
    from edgeplug._zoo._render import is_zoo_page  # torch: as in command

    if is_stream(path) or not os.path.isfile(path):
        return ""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        text = None
    if text is None or (text.strip() and not is_zoo_page(text)):
        raise EdgeplugError(
            f"cannot write the Markdown page (--markdown) {path}: it holds something other than a zoo page, "
            "which the run would replace; name another file (or remove this one)"
        )
    return text


def command(args: argparse.Namespace) -> int:
    if args.resume and not args.out:
        raise EdgeplugError("--resume needs --out CELLS.jsonl: the file whose missing cells to run")
    if args.retries < 0:
        raise EdgeplugError(f"--retries must be 0 or more, not {args.retries}")
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # wgpu only warns without it
    interactive = sys.stderr.isatty()
    progress, warn = _printers(args.quiet, interactive)
    _check_outputs(args)
    start = time.perf_counter()
    cells = _run_cells(args, progress, warn)
    if interactive and not args.quiet:
        print(file=sys.stderr)
    # torch: the zoo's modules load it, and `edgeplug --help` starts without it
    from edgeplug._zoo._render import table

    print(table(cells))
    if args.markdown:
        write_file(args.markdown, _page_text(args, cells, time.perf_counter() - start))
        print(f"wrote {args.markdown}")
    if args.out:
        print(f"cells in {args.out}")
    return 0


def _printers(quiet: bool, interactive: bool):
    """``progress(line)``: a cell's line (rewritten in place on a terminal), none with --quiet;
    ``warn(line)``: what the user must know, with --quiet too."""

    def progress(line: str) -> None:
        if quiet:
            return
        line = terminal_safe(line)  # a cell's line quotes model and backend text: shown, never acted on
        if interactive and line.startswith("["):
            print("\r\033[K" + line[: os.get_terminal_size(sys.stderr.fileno()).columns - 1], end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def warn(line: str) -> None:
        if interactive and not quiet:
            print(file=sys.stderr)
        print(f"edgeplug zoo: warning: {terminal_safe(line)}", file=sys.stderr, flush=True)

    return progress, warn


def _run_cells(args: argparse.Namespace, progress, warn) -> list:
    """Every cell the arguments name; on an error, Ctrl-C or SIGTERM, what finished is kept, and says so."""
    from edgeplug._zoo._run import load_cells, run  # torch: as in command

    try:
        return run(
            args.models, args.backends, args.schemes, compare_stock=args.compare_stock, jobs=args.jobs,
            executor=args.executor, address=args.address, timeout=args.timeout, memory_limit=args.memory_limit,
            retries=args.retries, out=args.out, resume=args.resume, layers=args.layers, repeat=args.repeat,
            progress=progress, warn=warn,
        )
    except BaseException as exc:
        if args.out and os.path.exists(args.out) and not isinstance(exc, EdgeplugError):
            kept = len(load_cells(args.out))
            print(f"\nedgeplug zoo: stopped; {args.out} keeps the {kept} cells finished: add --resume to run "
                  "the rest", file=sys.stderr, flush=True)
        raise


def _page_text(args: argparse.Namespace, cells: list, seconds: float) -> str:
    """The --markdown page: a run of float cells writes the page and keeps its quantized section; a
    quantized run rewrites that section."""
    # torch: as in command
    from edgeplug._zoo._record import FLOAT
    from edgeplug._zoo._render import QUANTIZED_BEGIN, QUANTIZED_END, render_page, render_quantized, splice_quantized

    floats = [c for c in cells if c.scheme == FLOAT]
    quantized = [c for c in cells if c.scheme != FLOAT]
    old = _page(args.markdown)
    text = render_page(floats, command_line(args), args.jobs, seconds, layers=args.layers, repeat=args.repeat,
                  executor=args.executor) if floats else old
    if quantized:
        text = splice_quantized(text, render_quantized(quantized, command_line(args), args.jobs, seconds, layers=args.layers))
    elif old and QUANTIZED_BEGIN in old and QUANTIZED_END in old:
        kept = QUANTIZED_BEGIN + old.split(QUANTIZED_BEGIN, 1)[1].split(QUANTIZED_END, 1)[0] + QUANTIZED_END
        text = splice_quantized(text, kept + "\n")
    return text
