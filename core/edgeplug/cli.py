"""`edgeplug` command line: backends, examples, lower."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from edgeplug.errors import EdgeplugError


def _err(msg: str) -> None:
    print(f"edgeplug: error: {msg}", file=sys.stderr)


def cmd_backends(args: argparse.Namespace) -> int:
    from edgeplug.backend import get_backend
    from edgeplug.plugins import manager

    m = manager()
    specs = m.backend_specs()
    rows = [("backend", "distribution", "version", "verify", "serializes here")]
    for name in sorted(specs):
        b = get_backend(name)
        a = b.availability()
        avail = "yes" if a.ok else f"no: {a.reason}"
        rows.append((name, b.distribution, b.version, b.spec.verify, avail))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
    if len(rows) == 1:
        print("no backends installed: pip install edgeplug-vulkan (or -webgpu, -qnn, -samsung, -xnnpack)")
    kernels = any(get_backend(n).spec.verify == "kernels" for n in specs)
    if args.adapter or (kernels and not args.no_adapter):
        try:
            from edgeplug.runtime import adapter_summary

            print(f"\nwgpu adapter: {adapter_summary()}")
        except Exception as exc:  # runtime is optional here
            print(f"\nwgpu adapter: none ({exc})")
    for p in m.problems():
        print(f"\nbroken plugin: {p.message}", file=sys.stderr)
    for info, why in m.skipped():
        print(f"skipped plugin {info.name!r} ({info.distribution}): {why}", file=sys.stderr)
    return 0


def cmd_examples(args: argparse.Namespace) -> int:
    from edgeplug.examples import list_examples

    for name, desc in list_examples().items():
        print(f"{name:<14} {desc}")
    return 0


def _write_atomically(path: Path, text: str) -> None:
    import os
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cmd_lower(args: argparse.Namespace) -> int:
    from edgeplug.backend import get_backend
    from edgeplug.examples import load_model
    from edgeplug.pipeline import lower

    start = time.perf_counter()

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"{time.perf_counter() - start:7.1f}s {msg}", file=sys.stderr, flush=True)

    backend = get_backend(args.backend)
    if not args.dry_run:
        backend.require_available()  # fail before spending a minute on export
    model, inputs, label = load_model(args.model)
    out = Path(args.output) if args.output else Path(f"{Path(label).stem.replace(':', '_')}-{backend.name}.pte")
    result = lower(model, inputs, backend, verify=args.verify, dry_run=args.dry_run, model_name=label, progress=progress)
    report = result.report
    v = report.verification
    failed = args.verify and v is not None and v.max_abs_diff > args.tolerance
    if args.dry_run:
        if args.output:
            report.notes.append(f"--dry-run: {out} was not written")
    elif failed:
        report.notes.append(f"verification failed: {out} was not written")
    else:
        try:
            result.save(out)
        except OSError as exc:
            raise EdgeplugError(f"cannot write {out}: {exc.strerror or exc}; nothing was written") from exc
    print(report.to_table())
    if args.report:
        rp = Path(args.report)
        try:
            _write_atomically(rp, report.to_json())
        except OSError as exc:
            raise EdgeplugError(f"cannot write the report {rp}: {exc.strerror or exc}") from exc
        print(f"wrote report {rp}")
    if failed:
        _err(
            f"verification failed: max |difference| {v.max_abs_diff:.3e} > tolerance {args.tolerance:g}; "
            f"no .pte was written (raise --tolerance to accept it)"
        )
        return 3
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgeplug", description="Lower PyTorch models to ExecuTorch backends through plugins.")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("backends", help="list installed backends")
    b.add_argument("--adapter", action="store_true", help="name the wgpu adapter even if no backend verifies with kernels")
    b.add_argument("--no-adapter", action="store_true", help="do not look for a wgpu adapter")
    b.set_defaults(fn=cmd_backends)
    e = sub.add_parser("examples", help="list built-in example models")
    e.set_defaults(fn=cmd_examples)
    lo = sub.add_parser("lower", help="lower a model for a backend and write a .pte")
    lo.add_argument("model", help="a built-in example name, or FILE.py:ATTR returning (model, example_inputs)")
    lo.add_argument("--backend", "-b", required=True)
    lo.add_argument("-o", "--output", help="where to write the .pte (default: MODEL-BACKEND.pte)")
    lo.add_argument("--report", help="also write the report as JSON here")
    lo.add_argument("--verify", action="store_true", help="run the lowered program and compare with eager")
    lo.add_argument("--tolerance", type=float, default=1e-4, help="max |difference| --verify accepts (default 1e-4)")
    lo.add_argument("--dry-run", action="store_true", help="partition and report; write no .pte")
    lo.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    lo.add_argument("-v", "--verbose", action="store_true", help="keep the warnings and logs of torch/executorch")
    lo.set_defaults(fn=cmd_lower)
    return p


def _quiet_dependencies() -> None:
    """Keep torch/torchao/executorch chatter (deprecations, optional .so loads) off the terminal."""
    import logging
    import warnings

    for category in (FutureWarning, DeprecationWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category)
    import torch  # noqa: F401  (torch configures its loggers on import; adjust after)

    for name in ("torchao", "torch", "executorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.WARNING)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if not getattr(args, "verbose", False):
        _quiet_dependencies()
    try:
        return args.fn(args)
    except EdgeplugError as exc:
        _err(str(exc))
        return 2
    except KeyboardInterrupt:
        _err("interrupted; nothing was written")
        return 130


if __name__ == "__main__":
    sys.exit(main())
