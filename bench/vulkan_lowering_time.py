"""Vulkan lowering time: edgeplug's lowering against stock ExecuTorch's flow, on ExecuTorch's backend suite's programs.

    python bench/vulkan_lowering_time.py [--backend vulkan] [--ops add,conv2d,...] [--repeat 3] [--profile 5] [--json out.json]

The programs: the first case (``--all-cases``: every case) of the first test (by name) of each operator file of ExecuTorch's backend test suite
(``executorch.backends.test.suite.operators``, shipped in the executorch wheel), float32, built as the suite builds
them (its per-test seed) and exported once as the suite exports them (``torch.export.export(strict=True)``). A test
that skips itself or whose model does not run in eager is left out (the suite skips it too), and said.

Each program is then lowered, in one process, by both sides, interleaved program by program (which side goes first
alternates) and repeated ``--repeat`` times; the median per program is kept:

- stock: what the suite's vulkan flow runs (``VulkanTester``): ``to_edge_transform_and_lower`` with
  ``VulkanPartitioner({"skip_bool_tensors": True})`` and ``EdgeCompileConfig(_check_ir_validity=False)``, then
  ``to_executorch()`` and the ``.pte`` bytes;
- edgeplug: ``edgeplug.lower(program, inputs, backend)``, a real lowering (it serializes, as stock does); its
  report's stage timings (``report.stages``, the lowering's one clock) are summed per stage.

Neither side generates an ETRecord unless ``--etrecord`` (the suite asks both for one). Export is not timed.
``--stock-patterns-cached`` adds a third side: stock's flow with executorch's Vulkan pattern graphs traced once per
process, as edgeplug's lowering has them traced (``pattern_graphs_traced_once``), so that what edgeplug's own work
costs shows apart from that fix.
A lowering that fails counts its time up to the failure, on either side, and is listed. ``--profile N`` runs
cProfile over edgeplug's lowering of the N programs where edgeplug's time exceeds stock's the most, and prints the
functions with the most cumulative and own time.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import inspect
import io
import json
import logging
import os
import pkgutil
import platform
import pstats
import statistics
import sys
import time
import unittest
import warnings
from collections import defaultdict
from typing import Any


class _Captured(Exception):
    """Raised by the capturing runner once the test has handed over the cases asked for."""


class _Capture:
    """Stands in for the suite's test runner: keeps the model and inputs of the test's first case (or of every
    case, ``all_cases``), then stops the test."""

    def __init__(self, flow: Any, all_cases: bool = False) -> None:
        self._flow = flow  # the suite's tests read the flow from their runner
        self.all_cases = all_cases
        self.cases: list = []

    def lower_and_run_model(self, model, inputs, generate_random_test_inputs=True, dynamic_shapes=None):
        self.cases.append((model, inputs, dynamic_shapes))
        if not self.all_cases:
            raise _Captured()


def _programs(ops: list[str], backend: str, all_cases: bool = False) -> tuple[list[dict], list[str]]:
    """(program records, what was left out and why) for the first test of each operator file: its first case,
    or each of its cases (``all_cases``)."""
    import torch

    import executorch.backends.test.suite.operators as package
    from executorch.backends.test.suite.runner import _get_test_seed

    from edgeplug.testing.executorch_suite import stock_flow

    flow = stock_flow(backend)

    names = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.name.startswith("test_"))
    wanted = [f"test_{op}" for op in ops] if ops else names
    missing = sorted(set(wanted) - set(names))
    if missing:
        sys.exit(f"no such operator file in the suite: {', '.join(missing)} (it has {len(names)})")
    programs, left = [], []
    for mod_name in wanted:
        module = importlib.import_module(f"{package.__name__}.{mod_name}")
        tests = [
            (name, fn) for name, fn in sorted(vars(module).items())
            if name.startswith("test_") and inspect.isfunction(fn) and "test_runner" in inspect.signature(fn).parameters
        ]
        if not tests:
            left.append(f"{mod_name}: no test taking a test_runner")
            continue
        name, fn = tests[0]
        capture = _Capture(flow, all_cases)
        kwargs = {"dtype": torch.float32} if "dtype" in inspect.signature(fn).parameters else {}
        torch.manual_seed(_get_test_seed(name))  # as the suite's run_test seeds it (here before the model is built)
        try:
            fn(capture, **kwargs)
        except _Captured:
            pass
        except unittest.SkipTest as exc:
            left.append(f"{mod_name}.{name}: the test skips itself ({exc})")
            continue
        if not capture.cases:
            left.append(f"{mod_name}.{name}: handed over no case")
            continue
        for k, (model, inputs, dynamic_shapes) in enumerate(capture.cases):
            label = mod_name if not all_cases else f"{mod_name}#{k}"
            try:
                model(*inputs)
                ep = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes, strict=True)
            except Exception as exc:  # the suite skips a case whose eager run or export fails
                left.append(f"{label} ({name}): {type(exc).__name__} in eager or export ({str(exc).splitlines()[0][:120]})")
                continue
            programs.append({"file": label, "test": name, "ep": ep, "inputs": tuple(inputs)})
    return programs, left


def _stock(ep: Any, backend: str, patterns_cached: bool = False, etrecord: bool = False) -> dict:
    import contextlib

    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    if backend == "vulkan":
        from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

        partitioner = VulkanPartitioner({"skip_bool_tensors": True})  # as the suite's VulkanTester builds it
    else:
        sys.exit(f"stock's flow is written here for vulkan only, not {backend!r}")
    scope = contextlib.nullcontext()
    if patterns_cached:  # stock's flow with the one patch of edgeplug's that applies to it (see the docstring)
        from edgeplug_vulkan_delegate._executorch import pattern_graphs_traced_once

        scope = pattern_graphs_traced_once()
    start = time.perf_counter()
    with scope:
        edge = to_edge_transform_and_lower(
            ep, partitioner=[partitioner], compile_config=EdgeCompileConfig(_check_ir_validity=False),
            generate_etrecord=etrecord,
        )
        lowered = time.perf_counter()
        pte = len(edge.to_executorch().buffer)
    end = time.perf_counter()
    return {"seconds": end - start, "stages": {"to_edge_transform_and_lower": lowered - start, "to_executorch": end - lowered},
            "pte_bytes": pte}


def _edgeplug(ep: Any, inputs: tuple, backend: str, etrecord: bool = False) -> dict:
    import edgeplug

    start = time.perf_counter()
    result = edgeplug.lower(ep, inputs, backend, model_name="suite program", etrecord=etrecord or None)
    end = time.perf_counter()
    stages: dict[str, float] = defaultdict(float)
    for s in result.report.stages:
        stages[s.stage] += s.seconds
    return {"seconds": end - start, "stages": dict(stages), "pte_bytes": result.report.model_dump().get("pte_bytes")}


def _timed(fn, *args) -> dict:
    start = time.perf_counter()
    try:
        return fn(*args)
    except Exception as exc:
        return {"seconds": time.perf_counter() - start, "stages": {}, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def _median_run(runs: list[dict]) -> dict:
    """The run of median total time (its stages with it), and the error if any run failed."""
    ordered = sorted(runs, key=lambda r: r["seconds"])
    run = dict(ordered[len(ordered) // 2])
    run["all_seconds"] = [round(r["seconds"], 3) for r in runs]
    return run


def _profile(program: dict, backend: str, top: int) -> str:
    import edgeplug

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        edgeplug.lower(program["ep"], program["inputs"], backend, model_name="suite program")
    except Exception:
        pass
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="vulkan")
    parser.add_argument("--ops", default="", help="operator files, comma-separated (default: all of them)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", type=int, default=0, help="cProfile edgeplug's lowering of the N programs it is slowest on, against stock")
    parser.add_argument("--profile-top", type=int, default=40)
    parser.add_argument("--stock-patterns-cached", action="store_true", help=(
        "a third side: stock's flow with executorch's Vulkan pattern graphs traced once per process, as edgeplug's "
        "lowering traces them (edgeplug_vulkan_delegate._executorch.pattern_graphs_traced_once)"))
    parser.add_argument("--all-cases", action="store_true", help="every case of each first test, not its first case only")
    parser.add_argument("--etrecord", action="store_true", help="both sides generate ExecuTorch's ETRecord, as the suite asks")
    parser.add_argument("--json", help="every run of every program, written after each program")
    parser.add_argument("--report", metavar="JSON", help="only print the summary of a --json file (a run's so far)")
    args = parser.parse_args()
    if args.report:
        return _report(args.report)

    logging.disable(logging.WARNING)  # the partitioners log every op they skip
    warnings.filterwarnings("ignore")
    import edgeplug  # noqa: F401  (loaded before timing: the first lowering must not pay for imports)
    from executorch.exir import to_edge_transform_and_lower  # noqa: F401

    started = time.perf_counter()
    programs, left = _programs([o for o in args.ops.split(",") if o], args.backend, args.all_cases)
    print(f"{len(programs)} programs ({len(left)} left out) in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    for why in left:
        print(f"  left out: {why}", file=sys.stderr)
    lowerings = {
        "stock": lambda p: _stock(p["ep"], args.backend, etrecord=args.etrecord),
        "edgeplug": lambda p: _edgeplug(p["ep"], p["inputs"], args.backend, etrecord=args.etrecord),
    }
    if args.stock_patterns_cached:
        lowerings["stock, patterns cached"] = lambda p: _stock(p["ep"], args.backend, patterns_cached=True, etrecord=args.etrecord)
    sides = list(lowerings)
    load = os.getloadavg()
    # one warm-up lowering per side (imports, executorch's one-time registrations), not counted
    if programs:
        for side in sides:
            _timed(lowerings[side], programs[0])
    runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in range(args.repeat):
        for i, p in enumerate(programs):
            k = (i + r) % len(sides)  # who goes first turns, program by program and repeat by repeat
            for side in sides[k:] + sides[:k]:
                runs[(p["file"], side)].append(_timed(lowerings[side], p))
            last = runs[(p["file"], "edgeplug")][-1]
            print(f"[{r + 1}/{args.repeat}] {p['file']}: " + ", ".join(
                f"{side} {runs[(p['file'], side)][-1]['seconds']:.2f} s" for side in sides) + " (edgeplug: " + ", ".join(
                f"{k} {v:.2f}" for k, v in last["stages"].items()) + ")", file=sys.stderr, flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"runs": {f"{a}|{b}": v for (a, b), v in runs.items()}, "left_out": left,
                               "tests": {p["file"]: p["test"] for p in programs}}, f, default=str)
    load_after = os.getloadavg()

    rows = _rows(runs, [(p["file"], p["test"]) for p in programs], sides)
    print(f"\n{args.backend}: {len(rows)} programs, median of {args.repeat} interleaved runs each; "
          f"load average {load[0]:.1f} before, {load_after[0]:.1f} after ({os.cpu_count()} cores), "
          f"torch {_version('torch')}, executorch {_version('executorch')}, Python {platform.python_version()}")
    _summary(rows, sides)
    excess = sorted(rows, key=lambda r: r["stock"]["seconds"] - r["edgeplug"]["seconds"])
    by_file = {p["file"]: p for p in programs}
    for r in excess[:args.profile]:
        print(f"\n== cProfile of edgeplug's lowering of {r['file']} ==")
        print(_profile(by_file[r["file"]], args.backend, args.profile_top))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "left_out": left, "load": [load, load_after], "repeat": args.repeat}, f, indent=1, default=str)


def _rows(runs: dict, programs: list[tuple[str, str]], sides: list[str]) -> list[dict]:
    """One row per program that every side ran: each side's median run."""
    rows = []
    for file, test in programs:
        if all(runs.get((file, side)) for side in sides):
            rows.append({"file": file, "test": test, **{side: _median_run(runs[(file, side)]) for side in sides}})
    return rows


def _summary(rows: list[dict], sides: list[str]) -> None:
    """The totals table, each side's stages summed, the failures, and where edgeplug exceeds stock most."""
    both = [r for r in rows if not any("error" in r[s] for s in sides)]
    stages: dict[str, dict[str, float]] = {s: defaultdict(float) for s in sides}
    for r in rows:
        for side in sides:
            for stage, seconds in r[side]["stages"].items():
                stages[side][stage] += seconds
    print("\n| programs | " + " | ".join(f"{s} (s)" for s in sides) + " | edgeplug / stock |"
          + (" edgeplug / stock with patterns cached |" if len(sides) > 2 else ""))
    print("| --- " * (len(sides) + 2 + (len(sides) > 2)) + "|")
    for label, subset in ((f"all {len(rows)}", rows), (f"the {len(both)} every side lowers", both)):
        total = {s: sum(r[s]["seconds"] for r in subset) for s in sides}
        print(f"| {label} | " + " | ".join(f"{total[s]:.1f}" for s in sides)
              + f" | {total['edgeplug'] / max(total['stock'], 1e-9):.2f}x |"
              + (f" {total['edgeplug'] / max(total[sides[2]], 1e-9):.2f}x |" if len(sides) > 2 else ""))
    for side in sides:
        print(f"\n{side}'s stages, summed over the programs (s): " + ", ".join(
            f"{k} {v:.1f}" for k, v in sorted(stages[side].items(), key=lambda kv: -kv[1])))
    for r in rows:
        for s in sides:
            if "error" in r[s]:
                print(f"- {r['file']}: {s} fails: {r[s]['error']}")
    excess = sorted(rows, key=lambda r: r["stock"]["seconds"] - r["edgeplug"]["seconds"])
    print("\nwhere edgeplug exceeds stock the most (program: stock s, edgeplug s, edgeplug's largest stages):")
    for r in excess[:10]:
        top = sorted(r["edgeplug"]["stages"].items(), key=lambda kv: -kv[1])[:3]
        print(f"- {r['file']}: {r['stock']['seconds']:.2f}, {r['edgeplug']['seconds']:.2f} "
              f"({', '.join(f'{k} {v:.2f}' for k, v in top)})")


def _report(path: str) -> None:
    """The summary of a ``--json`` file, also one a run is still writing (each program's runs so far)."""
    with open(path) as f:
        data = json.load(f)
    if "rows" in data:
        rows = data["rows"]
        sides = [k for k in rows[0] if k not in ("file", "test")] if rows else []
    else:
        runs: dict[tuple[str, str], list[dict]] = {}
        for key, value in data["runs"].items():
            file, side = key.split("|", 1)
            runs[(file, side)] = value
        sides = list(dict.fromkeys(side for _file, side in runs))
        files = list(dict.fromkeys(file for file, _side in runs))
        rows = _rows(runs, [(f, data.get("tests", {}).get(f, "")) for f in files], sides)
        counts = sorted({len(v) for v in runs.values()})
        print(f"{path}: {len(rows)} programs, {'-'.join(map(str, counts[::max(len(counts) - 1, 1)]))} runs each so far")
    _summary(rows, sides)


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    main()
