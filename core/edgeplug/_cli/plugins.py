"""`edgeplug backends`, `plugins`, `new-backend`, `examples`: what is installed, and a new plugin's skeleton.

The CLI is where the process's default plugin manager is read (``edgeplug._registry.lookup.manager``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys

from edgeplug._backend import INSTALL_HINT, Backend
from edgeplug._cli.common import err, say
from edgeplug._cli.quiet import native_output_hidden
from edgeplug._runtime.process import gpu_device
from edgeplug._registry.lookup import get_backend, manager
from edgeplug._registry import PluginManager, TimeLimit, failure, summaries, time_limit
from edgeplug._scaffold import unchecked_constructor, write
from edgeplug import _api, _executorch
from edgeplug._api import model_renames
from edgeplug._models import EXAMPLE_NAMES, MODELS

def cmd_backends(args: argparse.Namespace) -> int:
    m = manager()
    specs = m.backend_specs()
    rows = [("backend", "distribution", "version", "verify", "serializes here")]
    for name in sorted(specs):
        b = get_backend(name, registry=m)
        a = b.availability()
        avail = "yes" if a.ok else f"no: {a.reason}"
        if a.ok and args.probe and not args.no_probe:  # a partitioner that cannot be built fails every lowering
            broken = probe_partitioner(b)
            avail = f"no: {broken}" if broken else avail
        rows.append((name, b.distribution, b.version, _verify_column(b), avail))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows if specs else ():  # no backend: the error below, not an empty table
        say("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4], file=sys.stdout)
    _print_device_runtimes(m, specs)
    _print_support_notes(m, specs)
    if specs:  # no backend: the error below alone
        _print_versions()
    if specs and args.adapter and not args.no_adapter:  # opening an adapter takes longer than the listing
        try:  # the driver's own lines (Mesa's "XDG_RUNTIME_DIR is invalid", once per probe) stay off the terminal
            with native_output_hidden():
                described = gpu_device().describe()
            say(f"\nwgpu adapter: {described}", file=sys.stdout)
        except Exception as exc:  # runtime is optional here
            say(f"\nwgpu adapter: none ({exc})", file=sys.stdout)
    _print_plugin_trouble(m)
    if specs:
        return 0
    if m.problems() or m.conflicts():
        err("no backend is available: every installed plugin that registers one failed (see above)")
    elif m.skipped():
        err("no backend is available: every plugin is skipped (see above)")
    else:
        err(f"no backends installed: install a backend plugin, e.g. {INSTALL_HINT}")
    return 1


def _verify_column(backend: Backend) -> str:
    """What ``--verify`` runs for ``backend``, as the runtime line below says it: ``pte`` where the backend's
    own runtime is found (ExecuTorch's Vulkan runtime), else its ``verify_method``."""
    if backend.spec.device_runtime is None:
        return backend.spec.verify_method
    from edgeplug._verify.where import choose_target  # as in _print_device_runtimes

    return choose_target(backend).method


def _print_device_runtimes(m: PluginManager, specs: dict) -> None:
    """For each backend that has a runtime of its own (``BackendSpec.device_runtime``): whether it is
    built here, so the user knows what ``--verify`` will run."""
    from edgeplug._verify.where import choose_target, unrunnable  # no torch, no executorch: `edgeplug backends` stays fast

    for name in sorted(specs):
        if specs[name][1].device_runtime is None:
            continue
        backend = get_backend(name, registry=m)
        target = choose_target(backend)  # what --verify chooses, so the two say the same
        if target.runtime is not None:
            line = f"{target.runtime.name} (--verify runs the .pte in it)"
        elif target.method == "kernels":
            line = f"none, --verify runs the host emulation ({target.why_not})"
        elif target.method == "pte":
            line = f"none, --verify runs the .pte in ExecuTorch's Python runtime ({target.why_not})"
        else:
            line = f"none, --verify is refused: {unrunnable(backend, target)}"
        say(f"\n{name} runtime: {line}", file=sys.stdout)


def _print_support_notes(m: PluginManager, specs: dict) -> None:
    """For each backend whose support depends on the machine (``BackendSpec.support_note``): what a lowering
    would use now, as its report will say."""
    for name in sorted(specs):
        note = specs[name][1].support_note
        if note is None:
            continue
        try:
            line = note(None)
        except Exception as exc:  # the listing goes on; the plugin is named
            plugin = get_backend(name, registry=m).plugin
            line = f"its support note (BackendSpec.support_note) raised {failure(exc, plugin)}"
        if line:
            say(f"{name} support: {line}", file=sys.stdout)


def _print_versions() -> None:
    """What edgeplug runs on, and whether the ExecuTorch release is one it is tested with (outside the range,
    one warning line: the user may still try)."""
    found = _executorch.versions()
    line = ", ".join(f"{name} {version or 'not installed'}" for name, version in found.items())
    inside = _executorch.in_tested_range(found["executorch"])
    say(f"\nruns on: {line} (edgeplug is tested with executorch{_executorch.TESTED_RANGE}"
        f"{'' if inside else '; this release is outside it'})", file=sys.stdout)
    warning = _executorch.range_warning()
    if warning:
        say(f"edgeplug: warning: {warning}")


#: how long ``edgeplug backends`` waits for one partitioner factory
PROBE_SECONDS = 30.0


def probe_partitioner(backend: Backend, seconds: float = PROBE_SECONDS) -> str:
    """Build the backend's partitioner once: '' if it builds, else why not (its error, or a timeout)."""
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


def _print_plugin_trouble(m: PluginManager) -> None:
    """Broken and skipped plugins, unavailable backends and ignored records, on stderr."""
    for p in m.problems():
        say(f"\nbroken plugin: {p.message}")
    for c in m.conflicts():
        say(f"\nunavailable backend: {c.message}")
    for u in m.unclaimed():
        say(f"\nignored record: {u.message}")
    for info, why in m.skipped():
        say(f"skipped plugin {info.name!r} ({info.distribution}): {why}")


def cmd_plugins(args: argparse.Namespace) -> int:
    """Each plugin: distribution, version, entry point, status, and what it adds to which backend."""
    found = summaries(manager())
    if args.json:
        print(json.dumps([
            {
                "plugin": s.plugin.name, "distribution": s.plugin.distribution, "version": s.plugin.version,
                "entry_point": s.plugin.entry_point, "status": s.status, "reason": s.reason,
                "contributes": s.contributes, "trouble": s.trouble,
                "api_version": s.api_version, "deprecated": list(s.deprecated),
                "executorch": s.executorch, "executorch_warning": s.executorch_warning,
            }
            for s in found
        ], indent=2))
        return 0
    if not found:
        say(f"no edgeplug plugins installed: install a backend plugin, e.g. {INSTALL_HINT}", file=sys.stdout)
        return 0
    for s in found:
        status = s.status if not s.reason else f"{s.status}: {s.reason}"
        say(f"{s.plugin.name}: {s.plugin.distribution} {s.plugin.version}".rstrip(), file=sys.stdout)
        say(f"  entry point  {s.plugin.entry_point}", file=sys.stdout)
        say(f"  status       {status}", file=sys.stdout)
        if s.api_version is not None:
            say(f"  plugin API   {s.api_version}" + (f" (this edgeplug speaks {_api.current})" if s.api_version != _api.current else ""), file=sys.stdout)
        if s.status == "loaded":
            tested = f"executorch{s.executorch}" if s.executorch not in (None, "any") else "not declared (Requires-Dist on executorch)"
            say(f"  tested with  {tested}" + (" (outside it here: see the warning)" if s.executorch_warning else ""), file=sys.stdout)
        for sentence in s.deprecated:
            say(f"  deprecated   {sentence}", file=sys.stdout)
        for backend, what in sorted(s.contributes.items()):
            say(f"  adds to backend {backend!r}" + (f" ({s.trouble[backend]})" if backend in s.trouble else ""), file=sys.stdout)
            for phrase in what:
                say(f"    {phrase}", file=sys.stdout)
    return 0


def cmd_new_backend(args: argparse.Namespace) -> int:
    """Write a plugin package with every hook stubbed, its pyproject, and a conformance test."""
    unchecked = unchecked_constructor(args.partitioner, args.partitioner_args)
    if unchecked:
        print(f"edgeplug: warning: {unchecked}", file=sys.stderr)
    m = manager()  # the backends installed plugins register: a new one must not take a name of theirs
    registered = {name: f"{info.distribution} {info.version}".strip() for name, (info, _) in m.backend_specs().items()}
    root = write(
        args.name, args.output, partitioner=args.partitioner, backend_id=args.backend_id,
        partitioner_args=args.partitioner_args, imports=args.imports, backends=registered,
    )
    print(f"wrote {root}")
    print(f"next: pip install -e '{root}[test]' && edgeplug plugins && (cd {root} && pytest)")
    return 0


def cmd_examples(args: argparse.Namespace) -> int:
    """Every registry model by its name, with the short names `edgeplug lower` also takes for it."""
    deprecated = model_renames("edgeplug lower")
    short: dict[str, list[str]] = {}
    for public, name in EXAMPLE_NAMES.items():
        short.setdefault(name, []).append(f"{public}, deprecated" if public in deprecated else public)
    width = max(len(name) for name in MODELS)
    for name, model in MODELS.items():
        also = f" [also: {'; '.join(short[name])}]" if name in short else ""
        say(f"{name:<{width}}  {model.what}{also}", file=sys.stdout)
    return 0
