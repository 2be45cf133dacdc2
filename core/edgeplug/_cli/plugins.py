"""`edgeplug backends`, `plugins`, `new-backend`, `examples`: what is installed, and a new plugin's skeleton.

The CLI is where the process's default plugin manager is read (``edgeplug._registry.lookup.manager``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys

from edgeplug._backend import INSTALL_HINT
from edgeplug._cli.common import err
from edgeplug._runtime.process import gpu_device
from edgeplug._registry.lookup import get_backend, manager
from edgeplug._registry import PluginManager, TimeLimit, failure, summaries, time_limit
from edgeplug._scaffold import write
from edgeplug import _api
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
        if a.ok and not args.no_probe:  # a partitioner that cannot be built makes every lowering fail: say so here
            broken = probe_partitioner(b)
            avail = f"no: {broken}" if broken else avail
        rows.append((name, b.distribution, b.version, b.spec.verify_method, avail))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows if specs else ():  # no backend: the error below, not an empty table
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
    _print_device_runtimes(m, specs)
    kernels = any(spec.verify_method == "kernels" for _, spec in specs.values())
    if specs and (args.adapter or (kernels and not args.no_adapter)):
        try:
            print(f"\nwgpu adapter: {gpu_device().describe()}")
        except Exception as exc:  # runtime is optional here
            print(f"\nwgpu adapter: none ({exc})")
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


def _print_device_runtimes(m: PluginManager, specs: dict) -> None:
    """For each backend that has a runtime of its own (``BackendSpec.device_runtime``): whether it is
    built here, so the user knows what ``--verify`` will run."""
    from edgeplug._verify.targets import find_device_runtime  # torch: `edgeplug backends` starts without it

    for name in sorted(specs):
        if specs[name][1].device_runtime is None:
            continue
        runtime, why_not = find_device_runtime(get_backend(name, registry=m))
        if runtime is not None:
            print(f"\n{name} runtime: {runtime.name} (--verify runs the .pte in it)")
        else:
            print(f"\n{name} runtime: none, --verify runs the host emulation ({why_not})")


#: how long ``edgeplug backends`` waits for one partitioner factory
PROBE_SECONDS = 30.0


def probe_partitioner(backend: object, seconds: float = PROBE_SECONDS) -> str:
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
        print(f"\nbroken plugin: {p.message}", file=sys.stderr)
    for c in m.conflicts():
        print(f"\nunavailable backend: {c.message}", file=sys.stderr)
    for u in m.unclaimed():
        print(f"\nignored record: {u.message}", file=sys.stderr)
    for info, why in m.skipped():
        print(f"skipped plugin {info.name!r} ({info.distribution}): {why}", file=sys.stderr)


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
            }
            for s in found
        ], indent=2))
        return 0
    if not found:
        print(f"no edgeplug plugins installed: install a backend plugin, e.g. {INSTALL_HINT}")
        return 0
    for s in found:
        status = s.status if not s.reason else f"{s.status}: {s.reason}"
        print(f"{s.plugin.name}: {s.plugin.distribution} {s.plugin.version}".rstrip())
        print(f"  entry point  {s.plugin.entry_point}")
        print(f"  status       {status}")
        if s.api_version is not None:
            print(f"  plugin API   {s.api_version}" + (f" (this edgeplug speaks {_api.current})" if s.api_version != _api.current else ""))
        for sentence in s.deprecated:
            print(f"  deprecated   {sentence}")
        for backend, what in sorted(s.contributes.items()):
            print(f"  adds to backend {backend!r}" + (f" ({s.trouble[backend]})" if backend in s.trouble else ""))
            for phrase in what:
                print(f"    {phrase}")
    return 0


def cmd_new_backend(args: argparse.Namespace) -> int:
    """Write a plugin package with every hook stubbed, its pyproject, and a conformance test."""
    root = write(args.name, args.output, partitioner=args.partitioner, backend_id=args.backend_id)
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
        print(f"{name:<{width}}  {model.what}{also}")
    return 0
