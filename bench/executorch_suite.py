"""ExecuTorch's backend test suite (operators), through edgeplug's lowering and through stock's flow, side by side.

    python bench/executorch_suite.py --backend xnnpack [--ops adaptive_maxpool2d,lstm,...] [--seed N] [--json out.json]

Each operator file of ``executorch.backends.test.suite.operators`` (the float32 tests) runs once per flow, in one
process, the flows alternating test by test: stock's (the suite's own flow for the backend) and edgeplug's
(``edgeplug.testing.executorch_suite.edgeplug_flow``: the suite's stages, edgeplug's lowering). A test is counted as
the suite's pytest run counts it: it passes when every case does, it is skipped at its first case that fails for a
reason other than the backend (or that edgeplug refuses up front), and it fails at its first backend failure.
Cases are counted as the suite's runner classes them (a case with nothing delegated passes without being run). Prints a Markdown table and, per test, where the flows differ.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import pkgutil
import sys
import time
import unittest
from collections import Counter

import torch

#: a representative set: the operators issues 45 and 49 name, and common ones of each kind (lstm is left out for
#: time: its 11 tests take about 30 minutes for both flows on a loaded 2-core machine; pass --ops lstm for it)
DEFAULT_OPS = (
    "adaptive_maxpool1d,adaptive_maxpool2d,adaptive_maxpool3d,embedding_bag,median,round,"
    "linear,conv2d,add,upsample_bilinear2d,index_put,masked_fill"
)


class _Runner:
    """What the suite's tests call (``lower_and_run_model``), recording each case as the suite's pytest run does."""

    def __init__(self, flow, test_name: str, base_name: str) -> None:
        self._flow, self._test_name, self._test_base_name = flow, test_name, base_name
        self._subtest = 0
        self.cases: list[tuple[str, str]] = []  # (outcome, detail)

    def lower_and_run_model(self, model, inputs, generate_random_test_inputs=True, dynamic_shapes=None):
        from _pytest.outcomes import Skipped

        from executorch.backends.test.suite.runner import run_test

        try:
            summary = run_test(
                model, inputs, self._flow, self._test_name, self._test_base_name, self._subtest, None,
                generate_random_test_inputs=generate_random_test_inputs, dynamic_shapes=dynamic_shapes,
            )
        except Skipped as exc:  # edgeplug refused it up front (edgeplug.testing.executorch_suite)
            self._subtest += 1
            self.cases.append(("refused", str(exc)[:300]))
            raise _Stop("skipped")
        self._subtest += 1
        result = summary.result
        if result.is_success():
            self.cases.append(("delegated" if summary.is_delegated() else "undelegated", ""))
            return
        self.cases.append((result.name, str(summary.error)[:300] if summary.error else ""))
        raise _Stop("failed" if result.is_backend_failure() else "skipped")


class _Stop(Exception):
    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


def _tests(ops: list[str]):
    """(file, test name, function) for each float32 test of the named operator files."""
    import executorch.backends.test.suite.operators as package

    names = [m.name for m in pkgutil.iter_modules(package.__path__) if m.name.startswith("test_")]
    wanted = [f"test_{op}" for op in ops] if ops else names
    missing = sorted(set(wanted) - set(names))
    if missing:
        sys.exit(f"no such operator file in the suite: {', '.join(missing)} (it has {len(names)})")
    for mod_name in wanted:
        module = importlib.import_module(f"{package.__name__}.{mod_name}")
        for name, fn in sorted(vars(module).items()):
            if name.startswith("test_") and inspect.isfunction(fn) and "test_runner" in inspect.signature(fn).parameters:
                yield mod_name, name, fn


def _run_one(fn, flow, name: str):
    runner = _Runner(flow, f"{name}[{flow.name}]", name)
    args = {"dtype": torch.float32} if "dtype" in inspect.signature(fn).parameters else {}
    start = time.perf_counter()
    outcome = "passed"
    try:
        fn(runner, **args)
    except _Stop as stop:
        outcome = stop.outcome
    except unittest.SkipTest as exc:  # the test skips itself ("NaN and Inf are not enforced for backends")
        outcome = "skipped"
        runner.cases.append(("SKIPPED", f"the test skips itself: {exc}"[:300]))
    except Exception as exc:  # a test that breaks outside run_test: the suite's pytest run reports it failed
        outcome = "failed"
        runner.cases.append(("ERROR", f"{type(exc).__name__}: {exc}"[:300]))
    return outcome, runner.cases, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="xnnpack")
    parser.add_argument("--ops", default=DEFAULT_OPS, help="operator files, comma-separated ('' for all 82)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write every test's outcome and cases here")
    args = parser.parse_args()

    from executorch.backends.test.suite.reporting import begin_test_session, complete_test_session

    from edgeplug.testing.executorch_suite import edgeplug_flow, stock_flow

    flows = {"stock": stock_flow(args.backend), "edgeplug": edgeplug_flow(args.backend)}
    begin_test_session(None, seed=args.seed)
    rows = []
    for mod_name, name, fn in _tests([o for o in args.ops.split(",") if o]):
        row = {"file": mod_name, "test": name}
        for side, flow in flows.items():  # alternating, test by test, in one process
            if flow.should_skip_test(name)[0]:
                row[side] = ("skipped", [("skip_patterns", "")], 0.0)
                continue
            row[side] = _run_one(fn, flow, name)
        rows.append(row)
        print(f"{name}: " + ", ".join(f"{s} {row[s][0]} ({row[s][2]:.1f}s)" for s in flows), file=sys.stderr, flush=True)
    complete_test_session()
    _print_table(rows, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


def _print_table(rows, args) -> None:
    sides = ("stock", "edgeplug")
    tests = {s: Counter(r[s][0] for r in rows) for s in sides}
    cases = {s: Counter(c for r in rows for c, _ in r[s][1]) for s in sides}
    seconds = {s: sum(r[s][2] for r in rows) for s in sides}
    print(f"\n| {args.backend}, {len(rows)} float32 operator tests | stock's flow | through edgeplug |")
    print("| --- | --- | --- |")
    print("| tests passed / skipped / failed | " + " | ".join(
        f"{tests[s]['passed']} / {tests[s]['skipped']} / {tests[s]['failed']}" for s in sides) + " |")
    print("| cases run and matching eager, delegated | " + " | ".join(str(cases[s]["delegated"]) for s in sides) + " |")
    print("| cases passed with nothing delegated (the suite does not run them) | " + " | ".join(
        str(cases[s]["undelegated"]) for s in sides) + " |")
    print("| cases the suite skips (an op no portable kernel runs left undelegated, ...) | " + " | ".join(
        str(cases[s]["SKIPPED"]) for s in sides) + " |")
    print("| cases refused up front (no CPU kernel) | " + " | ".join(str(cases[s]["refused"]) for s in sides) + " |")
    print("| cases failing at lowering | " + " | ".join(str(cases[s]["LOWER_FAIL"]) for s in sides) + " |")
    print("| cases failing after lowering (run, mismatch, other) | " + " | ".join(
        str(sum(v for k, v in cases[s].items() if k in ("PTE_LOAD_FAIL", "PTE_RUN_FAIL", "OUTPUT_MISMATCH_FAIL", "UNKNOWN_FAIL", "ERROR")))
        for s in sides) + " |")
    print("| seconds (one process, alternating) | " + " | ".join(f"{seconds[s]:.0f}" for s in sides) + " |")
    lost = [r["test"] for r in rows if r["stock"][0] == "passed" and r["edgeplug"][0] != "passed"]
    print(f"\nstock passes, edgeplug does not: {', '.join(lost) or 'none'}")
    for r in rows:
        if r["stock"][0] != r["edgeplug"][0]:
            print(f"- {r['test']}: stock {r['stock'][0]}, edgeplug {r['edgeplug'][0]}: {r['edgeplug'][1][-1:]}")


if __name__ == "__main__":
    main()
