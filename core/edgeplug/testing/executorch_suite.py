"""ExecuTorch's backend test suite through edgeplug's lowering (issue 45).

The executorch wheel ships the suite ExecuTorch holds its own backends to: operator and model tests
(``executorch.backends.test.suite``), each run as a *flow* (``TestFlow``) through a ``Tester`` whose stages export,
lower, ``to_executorch``, serialize, run the ``.pte`` and compare with eager. ``edgeplug_flow(backend)`` is such a
flow for any installed edgeplug backend: the suite's own stages, with only the lowering stage replaced by
``edgeplug.lower`` (a real lowering, its ETRecord kept, as the suite's runner reads it for its op counts).
``edgeplug.lower`` returns the edge-dialect program it partitioned, so the suite's ``to_executorch`` runs on it as it
would on stock's.

One difference is stated rather than hidden: where edgeplug refuses a program up front because an op outside
core ATen would run on the CPU with no ExecuTorch kernel (``NoCpuKernelError``), the case is *refused* with that
reason (inside a pytest run of the suite, a skip saying so), where the suite skips stock's case once its lowering
shows such an op left undelegated.

The one command, for any installed backend (yours too)::

    python -m edgeplug.testing.executorch_suite --backend mybackend [--ops add,linear] [--json out.json]

runs the suite's float32 operator tests through edgeplug's flow and, where the suite has a flow for the backend,
through stock's, test by test in one process, prints a Markdown table (per test: passed / lowered but mismatched /
lowering failed / skipped / refused up front, delegated cases, edgeplug and stock side by side) and exits 1 when a
test stock's flow passes does not pass through edgeplug (or is not refused up front with edgeplug's reason).
Cases run where ``edgeplug lower --verify`` runs a program: in the backend's own runtime where one is found here
(``BackendSpec.device_runtime``: ExecuTorch's Vulkan or WebGPU runtime built from source), stock's ``.pte`` and
edgeplug's alike, else in ExecuTorch's Python runtime (``verify_method="pte"``). A backend that nothing here runs
stops after lowering and says so; one that cannot serialize here lowers as a dry run.

- ``edgeplug_flow``: ``edgeplug_flow(backend, *, name=None, skip_patterns=(), dry_run=False)``, the suite's
  ``TestFlow`` lowering with edgeplug for ``backend`` (named ``edgeplug-BACKEND``).
- ``edgeplug_tester``: ``edgeplug_tester(backend, *, dry_run=False)``, that flow's ``tester_factory``: ExecuTorch's
  ``Tester`` with edgeplug's lowering stage, for a flow of your own (quantized, other skip patterns).
- ``stock_flow``: ``stock_flow(backend)``, the suite's own float flow for the backend (what stock ExecuTorch runs).
- ``run_operator_tests``: ``run_operator_tests(backend, ops=None, *, tests=None, first_of_each_file=False,
  stock=True, lower_only=None, dry_run=None, seed=0, progress=None)``, the suite's float32 operator tests through
  both flows, as a ``SuiteRun``.
- ``SuiteRun``: what such a run found: its ``rows``, ``table()`` (Markdown), ``lost()`` (the tests stock's flow
  passes and edgeplug neither passes nor refuses up front), ``refused()``, ``notes`` and ``runtime`` (what ran
  the cases; empty when lowering only).
- ``SuiteRow``: one test: its operator ``file``, ``test`` name and a ``FlowOutcome`` per flow (``"stock"``,
  ``"edgeplug"``).
- ``FlowOutcome``: one test through one flow: ``outcome`` (passed / refused / skipped / failed), its ``cases``
  (kind, detail) and ``seconds``.
- ``run_command``: the command above (``python -m edgeplug.testing.executorch_suite --help``).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import inspect
import json
import pkgutil
import sys
import time
import unittest
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

from edgeplug._errors import EdgeplugError

#: what a refusal up front says, first (a pytest skip inside the suite's own pytest run)
REFUSED = "edgeplug refused it up front"
#: a case's kinds that mean it failed after lowering (the suite's TestResult names)
_AFTER_LOWERING = ("PTE_LOAD_FAIL", "PTE_RUN_FAIL", "OUTPUT_MISMATCH_FAIL", "UNKNOWN_FAIL")


def _stage(backend: str, example_inputs: tuple, dry_run: bool = False) -> Any:
    """The suite's lowering stage, as edgeplug lowers for ``backend``."""
    # executorch's test harness and the façade: loaded when a flow runs (pytest imports edgeplug.testing at startup)
    from executorch.backends.test.harness.stages import Stage, StageType

    from edgeplug._facade import lower  # as above
    from edgeplug._graph.ir_check import NoCpuKernelError  # as above

    class EdgeplugLowering(Stage):
        def __init__(self) -> None:
            self.result: Any = None

        def stage_type(self) -> Any:
            return StageType.TO_EDGE_TRANSFORM_AND_LOWER

        def run(self, artifact: Any, inputs: Any = None, generate_etrecord: bool = False) -> None:
            try:
                # the ETRecord always (a dry run has none): the suite's runner counts delegated ops from it
                self.result = lower(
                    artifact, tuple(example_inputs), backend, etrecord=not dry_run or None, dry_run=dry_run,
                    model_name="suite case",
                )
            except NoCpuKernelError as exc:
                import pytest  # only inside a pytest run, where the suite's cases skip

                pytest.skip(f"{REFUSED}: {exc}")

        @property
        def artifact(self) -> Any:
            return self.result.edge

        @property
        def graph_module(self) -> Any:
            return self.result.edge.exported_program().graph_module

    return EdgeplugLowering()


def edgeplug_tester(backend: str, *, dry_run: bool = False) -> Callable[..., Any]:
    """A ``tester_factory`` for a ``TestFlow``: ExecuTorch's ``Tester`` with edgeplug's lowering stage (a dry run
    with ``dry_run``: no ETRecord, no ``.pte`` to run)."""
    # executorch's test harness: loaded when a flow is built (pytest imports edgeplug.testing at startup)
    from executorch.backends.test.harness import Tester
    from executorch.backends.test.harness.stages import StageType  # as above

    def factory(module: Any, example_inputs: tuple, dynamic_shapes: Optional[Any] = None) -> Any:
        stages = Tester.default_stage_classes() | {
            StageType.TO_EDGE_TRANSFORM_AND_LOWER: lambda *a, **k: _stage(backend, example_inputs, dry_run),
        }
        return Tester(module, example_inputs, stage_classes=stages, dynamic_shapes=dynamic_shapes)

    return factory


def edgeplug_flow(
    backend: str, *, name: Optional[str] = None, skip_patterns: tuple[str, ...] = (), dry_run: bool = False
) -> Any:
    """A ``TestFlow`` of ExecuTorch's backend test suite that lowers with edgeplug for ``backend`` (float, not
    quantized). ``name`` defaults to ``edgeplug-BACKEND``; ``skip_patterns`` as the suite's flows take them."""
    # executorch's test suite and the façade: loaded when a flow is built (pytest imports edgeplug.testing at startup)
    from executorch.backends.test.suite.flow import TestFlow

    from edgeplug._facade import resolve  # as above

    resolve(backend, "edgeplug.testing.executorch_suite.edgeplug_flow")  # an unknown backend is refused here, naming the installed ones
    return TestFlow(
        name or f"edgeplug-{backend}", backend=backend, tester_factory=edgeplug_tester(backend, dry_run=dry_run),
        skip_patterns=list(skip_patterns),
    )


def stock_flow(backend: str) -> Any:
    """The suite's own float flow for ``backend`` (what stock ExecuTorch runs), or an error naming the flows it has."""
    from executorch.backends.test.suite.flow import all_flows  # executorch's test suite: only when asked for

    flows = all_flows()
    if backend not in flows:
        raise EdgeplugError(
            f"ExecuTorch's backend test suite has no flow named {backend!r} here (it has: {', '.join(sorted(flows))})"
        )
    return flows[backend]


# -- running the operator tests --------------------------------------------------------------------------------


@dataclass
class FlowOutcome:
    """One test of the suite through one flow: ``outcome`` is ``"passed"`` (every case), ``"refused"`` (edgeplug
    refused a case up front, with its reason), ``"skipped"`` (a case failed for a reason other than the backend,
    as the suite's runner classes it) or ``"failed"`` (a case failed in the backend's lowering or after it); the
    test stops at its first case that does not pass, as in the suite's pytest run. ``cases`` are
    ``(kind, detail)``: ``delegated``, ``undelegated`` (nothing delegated: the suite passes it without running it),
    ``lowered`` (delegated, lowering only: not run), ``refused``, ``skip_patterns`` or the suite's ``TestResult``
    name (``SKIPPED``, ``LOWER_FAIL``, ``OUTPUT_MISMATCH_FAIL``, ...)."""

    outcome: str
    cases: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class SuiteRow:
    """One operator test: the suite's ``file`` (``test_add``), the ``test`` name, and a ``FlowOutcome`` per flow
    (``"edgeplug"``, and ``"stock"`` where the suite has a flow for the backend)."""

    file: str
    test: str
    flows: dict[str, FlowOutcome] = field(default_factory=dict)


@dataclass
class SuiteRun:
    """What ``run_operator_tests`` found: the ``rows``, and how it ran (``lower_only``, ``dry_run``, the stock
    flow's name or None) with ``notes`` saying why."""

    backend: str
    rows: list[SuiteRow]
    lower_only: bool
    dry_run: bool
    stock: Optional[str]
    notes: list[str] = field(default_factory=list)
    #: what ran the cases (both flows' ``.pte``): the backend's own runtime where found (``BackendSpec.device_runtime``,
    #: e.g. ExecuTorch's Vulkan runtime built here), else ExecuTorch's Python runtime; empty when lowering only
    runtime: str = ""

    def lost(self) -> list[SuiteRow]:
        """The tests stock's flow passes and edgeplug neither passes nor refuses up front (none is the goal)."""
        return [
            r for r in self.rows
            if "stock" in r.flows and r.flows["stock"].outcome == "passed"
            and r.flows["edgeplug"].outcome not in ("passed", "refused")
        ]

    def refused(self) -> list[SuiteRow]:
        """The tests edgeplug refused up front (an op outside core ATen left on the CPU with no kernel)."""
        return [r for r in self.rows if r.flows["edgeplug"].outcome == "refused"]

    def table(self) -> str:
        """The run as Markdown: tests and cases per flow, then each test where the flows differ."""
        sides = [s for s in ("stock", "edgeplug") if any(s in r.flows for r in self.rows)]
        tests = {s: Counter(r.flows[s].outcome for r in self.rows if s in r.flows) for s in sides}
        cases = {s: Counter(k for r in self.rows if s in r.flows for k, _ in r.flows[s].cases) for s in sides}
        delegated = {s: sum(1 for r in self.rows if s in r.flows and _delegated(r.flows[s])) for s in sides}
        secs = {s: sum(r.flows[s].seconds for r in self.rows if s in r.flows) for s in sides}
        heads = {"stock": f"stock's flow ({self.stock})", "edgeplug": "through edgeplug" + (" (dry run)" if self.dry_run else "")}
        mode = "lowering only" if self.lower_only else f"lowered, run in {self.runtime or 'ExecuTorch' + chr(39) + 's runtime'} and compared with eager"
        out = [f"| {self.backend}, {len(self.rows)} float32 operator tests, {mode} | " + " | ".join(heads[s] for s in sides) + " |",
               "| --- |" + " --- |" * len(sides)]

        def row(label: str, values: Callable[[str], Any]) -> None:
            out.append(f"| {label} | " + " | ".join(str(values(s)) for s in sides) + " |")

        row(f"tests {'lowered' if self.lower_only else 'passed'} / refused up front / skipped / failed",
            lambda s: f"{tests[s]['passed']} / {tests[s]['refused']} / {tests[s]['skipped']} / {tests[s]['failed']}")
        row("tests with a case delegated", lambda s: delegated[s])
        if self.lower_only:
            row("cases lowered, something delegated (not run)", lambda s: cases[s]["lowered"])
        else:
            row("cases run and matching eager, delegated", lambda s: cases[s]["delegated"])
        row("cases lowered with nothing delegated (the suite does not run them)", lambda s: cases[s]["undelegated"])
        row("cases the suite skips (export fails, an op no portable kernel runs left undelegated, ...)",
            lambda s: cases[s]["SKIPPED"] + cases[s]["skip_patterns"])
        row("cases refused up front by edgeplug (no CPU kernel for an op outside core ATen)", lambda s: cases[s]["refused"])
        row("cases failing at lowering", lambda s: cases[s]["LOWER_FAIL"] + cases[s]["ERROR"])
        if not self.lower_only:
            row("cases lowered but mismatched (output differs from eager)", lambda s: cases[s]["OUTPUT_MISMATCH_FAIL"])
            row("cases failing after lowering (load, run, other)",
                lambda s: sum(cases[s][k] for k in _AFTER_LOWERING if k != "OUTPUT_MISMATCH_FAIL"))
        row("seconds (one process, the flows alternating test by test)", lambda s: f"{secs[s]:.0f}")
        lost = self.lost()
        out += ["", f"stock passes, edgeplug neither passes nor refuses up front: {', '.join(r.test for r in lost) or 'none'}"]
        for r in self.rows:
            if "stock" in r.flows and r.flows["stock"].outcome != r.flows["edgeplug"].outcome:
                last = r.flows["edgeplug"].cases[-1:] or [("", "")]
                out.append(f"- {r.test}: stock {r.flows['stock'].outcome}, edgeplug {r.flows['edgeplug'].outcome}"
                           + (f" ({last[0][0]}: {last[0][1][:200]})" if last[0][1] else ""))
        out += [f"\n{n}" for n in self.notes]
        return "\n".join(out)


def _delegated(outcome: FlowOutcome) -> bool:
    return any(k in ("delegated", "lowered") for k, _ in outcome.cases)


class _Stop(Exception):
    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


class _Runner:
    """What the suite's tests call (``lower_and_run_model``), recording each case as the suite's runner classes it."""

    def __init__(self, flow: Any, test_name: str, base_name: str, lower_only: bool) -> None:
        self._flow, self._test_name, self._base_name, self._lower_only = flow, test_name, base_name, lower_only
        self._subtest = 0
        self.cases: list[tuple[str, str]] = []

    def lower_and_run_model(self, model: Any, inputs: Any, generate_random_test_inputs: bool = True,
                            dynamic_shapes: Any = None) -> None:
        from _pytest.outcomes import Skipped  # a refusal up front (the flow's lowering stage skips)

        try:
            if self._lower_only:
                kind, detail = _lower_case(self._flow, model, inputs, self._base_name, dynamic_shapes)
            else:
                kind, detail = _run_case(self._flow, model, inputs, self._test_name, self._base_name, self._subtest,
                                         generate_random_test_inputs, dynamic_shapes)
        except Skipped as exc:
            kind, detail = ("refused" if str(exc).startswith(REFUSED) else "SKIPPED"), str(exc)[:600]
        self._subtest += 1
        self.cases.append((kind, detail))
        if kind == "refused":
            raise _Stop("refused")
        if kind in ("SKIPPED", "skip_patterns"):
            raise _Stop("skipped")
        if kind not in ("delegated", "undelegated", "lowered"):
            raise _Stop("failed")


def _run_case(flow: Any, model: Any, inputs: Any, test_name: str, base_name: str, subtest: int,
              random_inputs: bool, dynamic_shapes: Any) -> tuple[str, str]:
    """One case through the suite's own runner: lowered, run in ExecuTorch's runtime and compared with eager."""
    from executorch.backends.test.suite.runner import run_test  # executorch's test suite: only when a run asks

    summary = run_test(model, inputs, flow, test_name, base_name, subtest, None,
                       generate_random_test_inputs=random_inputs, dynamic_shapes=dynamic_shapes)
    if summary.result.is_success():
        return ("delegated" if summary.is_delegated() else "undelegated"), ""
    return summary.result.name, (f"{type(summary.error).__name__}: {summary.error}"[:600] if summary.error else "")


def _lower_case(flow: Any, model: Any, inputs: Any, base_name: str, dynamic_shapes: Any) -> tuple[str, str]:
    """One case, lowering only, classed as the suite's runner classes it up to its lowering: the model must run in
    eager and export (else skipped), then lower; an op the suite knows no portable kernel runs, left undelegated,
    is skipped as the runner skips it."""
    import torch  # with the suite's modules below, loaded when a run asks (pytest imports edgeplug.testing at startup)
    from executorch.backends.test.suite.reporting import count_ops  # executorch's test suite: only when a run asks
    from executorch.backends.test.harness.stages import StageType  # as above
    from executorch.backends.test.suite.runner import UNSUPPORTED_PORTABLE_OPS  # as above

    torch.manual_seed(int.from_bytes(hashlib.md5(base_name.encode()).digest()[:4], "little"))
    try:
        model(*inputs)
        tester = flow.tester_factory(model, inputs, **({"dynamic_shapes": dynamic_shapes} if dynamic_shapes else {}))
        tester.export()
    except Exception as exc:
        return "SKIPPED", f"eager or export: {type(exc).__name__}: {exc}"[:600]
    try:
        tester.to_edge_transform_and_lower()
    except Exception as exc:
        return "LOWER_FAIL", f"{type(exc).__name__}: {exc}"[:600]
    graph = tester.stages[tester.cur].graph_module.graph
    delegated = any(n.op == "call_function" and "executorch_call_delegate" in str(n.target) for n in graph.nodes)
    left = count_ops({"forward": tester.get_artifact().exported_program()})
    missing = sorted(op for op in left if op in UNSUPPORTED_PORTABLE_OPS)
    if missing:
        return "SKIPPED", f"left on the CPU where no portable kernel runs it: {', '.join(missing)}"
    if _has_3d_convolution(tester.stages[StageType.EXPORT].artifact):
        return "SKIPPED", "a 3-d convolution: the suite's runner skips it (ExecuTorch's portable kernels run none)"
    return ("lowered" if delegated else "undelegated"), ""


def _has_3d_convolution(ep: Any) -> bool:
    """Whether the exported program convolves an input of rank 5 (the suite's runner skips such a case after
    lowering, delegated or not, as the portable kernels cannot run it)."""
    for node in ep.graph.nodes:
        if node.op == "call_function" and "conv" in str(node.target) and node.args:
            value = getattr(node.args[0], "meta", {}).get("val")
            if value is not None and hasattr(value, "dim") and value.dim() > 4:
                return True
    return False


def _in_runtime(flow: Any, runtime: Any) -> Any:
    """``flow`` with each case's ``.pte`` run in ``runtime`` (a ``BackendSpec.device_runtime()``: the backend's own
    runtime built here) instead of ExecuTorch's Python runtime, which does not link the backend's delegate: the
    suite's Serialize stage with its ``run_artifact`` replaced, everything else (lowering, inputs, comparison with
    eager, tolerances) the flow's own. Stock's flow and edgeplug's are given the same runtime."""
    # executorch's test harness: loaded when a run asks (pytest imports edgeplug.testing at startup)
    from executorch.backends.test.harness.stages import Serialize, StageType
    from torch.utils._pytree import tree_flatten  # as the suite's Serialize stage flattens its inputs

    class InBackendRuntime(Serialize):
        def run_artifact(self, inputs: Any) -> Any:
            flat, _ = tree_flatten(inputs)
            outputs, _adapter = runtime.run(self.buffer, None, [list(flat)])
            return list(outputs[0])

    make = flow.tester_factory

    def factory(*args: Any, **kwargs: Any) -> Any:
        tester = make(*args, **kwargs)
        tester.stage_classes = {**tester.stage_classes, StageType.SERIALIZE: InBackendRuntime}
        return tester

    return dataclasses.replace(flow, tester_factory=factory)


def _operator_tests(ops: Optional[Sequence[str]], tests: Optional[Sequence[str]],
                    first_of_each_file: bool) -> list[tuple[str, str, Callable[..., Any]]]:
    """(file, test name, function) for the float32 tests of the suite's operator files named (all where None)."""
    import executorch.backends.test.suite.operators as package  # executorch's test suite: only when a run asks

    names = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.name.startswith("test_"))
    wanted = [f"test_{op.removeprefix('test_')}" for op in ops] if ops else names
    missing = sorted(set(wanted) - set(names))
    if missing:
        raise EdgeplugError(
            f"ExecuTorch's backend test suite has no operator file {', '.join(missing)} (it has {len(names)}: "
            f"{', '.join(n.removeprefix('test_') for n in names)})"
        )
    found: list[tuple[str, str, Callable[..., Any]]] = []
    for mod_name in wanted:
        module = importlib.import_module(f"{package.__name__}.{mod_name}")
        fns = [
            (mod_name, name, fn) for name, fn in sorted(vars(module).items())
            if name.startswith("test_") and inspect.isfunction(fn) and "test_runner" in inspect.signature(fn).parameters
        ]
        found += fns[:1] if first_of_each_file else fns
    if tests:
        known = {name for _m, name, _f in found}
        unknown = sorted(set(tests) - known)
        if unknown:
            raise EdgeplugError(f"no such test in the operator files asked for: {', '.join(unknown)}")
        found = [t for t in found if t[1] in set(tests)]
    return found


def _run_test(fn: Callable[..., Any], flow: Any, name: str, lower_only: bool) -> FlowOutcome:
    import torch  # loaded when a run asks (pytest imports edgeplug.testing at startup)

    if flow.should_skip_test(name)[0]:
        return FlowOutcome("skipped", [("skip_patterns", f"{flow.name}'s skip_patterns")])
    runner = _Runner(flow, f"{name}[{flow.name}]", name, lower_only)
    args = {"dtype": torch.float32} if "dtype" in inspect.signature(fn).parameters else {}
    start = time.perf_counter()
    outcome = "passed"
    try:
        fn(runner, **args)
    except _Stop as stop:
        outcome = stop.outcome
    except unittest.SkipTest as exc:  # the test skips itself ("NaN and Inf are not enforced for backends")
        outcome = "skipped"
        runner.cases.append(("SKIPPED", f"the test skips itself: {exc}"[:600]))
    except Exception as exc:  # a test that breaks outside the runner: the suite's pytest run reports it failed
        outcome = "failed"
        runner.cases.append(("ERROR", f"{type(exc).__name__}: {exc}"[:600]))
    return FlowOutcome(outcome, runner.cases, time.perf_counter() - start)


def _where_cases_run(b: Any, dry_run: bool, lower_only: Optional[bool], notes: list[str]) -> tuple[bool, Any]:
    """Whether the cases stop after lowering (``lower_only`` as asked, else where nothing here runs the backend's
    delegates), and the backend's own runtime that runs them where one is found (else None: ExecuTorch's Python
    runtime, or nothing), saying why in ``notes``: the same choice ``edgeplug lower --verify`` makes."""
    from edgeplug._verify.where import choose_target  # the façade's verification: loaded when a run asks

    target = None if dry_run else choose_target(b)
    if lower_only is None:
        lower_only = dry_run or target is None or target.method != "pte"
        if lower_only and not dry_run:
            notes.append(
                f"lowering only: nothing here runs the {b.name} backend's delegates (its verify_method is "
                f"{b.spec.verify_method!r}{'; ' + target.why_not if target and target.why_not else ''}), so no case "
                "is run or compared with eager"
            )
    if lower_only or target is None or target.runtime is None:
        return lower_only, None
    notes.append(
        f"each case's .pte, stock's and edgeplug's alike, runs in {target.runtime.name} (the {b.name} backend's "
        "own runtime, found here), not ExecuTorch's Python runtime, which does not link its delegate"
    )
    return lower_only, target.runtime


def run_operator_tests(
    backend: str,
    ops: Optional[Iterable[str]] = None,
    *,
    tests: Optional[Iterable[str]] = None,
    first_of_each_file: bool = False,
    stock: bool = True,
    lower_only: Optional[bool] = None,
    dry_run: Optional[bool] = None,
    seed: int = 0,
    progress: Optional[Callable[[SuiteRow], None]] = None,
) -> SuiteRun:
    """The suite's float32 operator tests (``ops``: operator files, ``add`` or ``test_add``; all 80-odd where
    None; ``tests``: only these test names; ``first_of_each_file``: one test a file) through edgeplug's flow for
    ``backend`` and, with ``stock`` and where the suite has one, stock's flow, alternating test by test in this
    process. ``lower_only`` (default: where nothing here runs the backend's delegates) stops each case after
    lowering; ``dry_run`` (default: where the backend cannot serialize here) lowers as a dry run. Cases run where
    ``edgeplug lower --verify`` would run them: in the backend's own runtime where one is found here
    (``BackendSpec.device_runtime``; stock's ``.pte`` too), else in ExecuTorch's Python runtime.
    ``progress`` is called with each row as it is done."""
    # executorch's test suite: only when a run asks
    from executorch.backends.test.suite.reporting import begin_test_session, complete_test_session

    from edgeplug._facade import resolve  # the façade: loaded when a run is asked for

    b = resolve(backend, "edgeplug.testing.executorch_suite.run_operator_tests")
    notes = []
    available = b.availability()
    if dry_run is None:
        dry_run = not available.ok
        if dry_run:
            notes.append(f"edgeplug lowers as a dry run: backend {backend!r} cannot serialize here ({available.reason})")
    lower_only, runtime = _where_cases_run(b, dry_run, lower_only, notes)
    flows = {"edgeplug": edgeplug_flow(backend, dry_run=dry_run)}
    stock_name = None
    if stock:
        try:
            flows = {"stock": stock_flow(backend), **flows}
            stock_name = flows["stock"].name
        except EdgeplugError as exc:
            notes.append(f"edgeplug's flow only: {exc}")
    if runtime is not None:
        flows = {side: _in_runtime(flow, runtime) for side, flow in flows.items()}
    chosen = _operator_tests(list(ops) if ops is not None else None, list(tests) if tests is not None else None,
                             first_of_each_file)
    rows = []
    begin_test_session(None, seed=seed)
    try:
        for mod_name, name, fn in chosen:
            row = SuiteRow(mod_name, name, {side: _run_test(fn, flow, name, lower_only) for side, flow in flows.items()})
            rows.append(row)
            if progress is not None:
                progress(row)
    finally:
        complete_test_session()
    ran_in = "" if lower_only else (runtime.name if runtime is not None else "ExecuTorch's Python runtime")
    return SuiteRun(backend, rows, lower_only, dry_run, stock_name, notes, ran_in)


def run_command(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m edgeplug.testing.executorch_suite --backend NAME``: prints the table; returns 1 where ``lost()``
    is not empty (a test stock's flow passes that edgeplug neither passes nor refuses up front), 2 where nothing ran
    (an unknown backend, operator file or test, said in one line), 130 when interrupted (said in one line, nothing
    written), else 0."""
    parser = argparse.ArgumentParser(
        prog="python -m edgeplug.testing.executorch_suite",
        description="ExecuTorch's backend test suite (float32 operator tests) through edgeplug's lowering of a "
        "backend, beside stock's flow for it where the suite has one",
    )
    parser.add_argument("--backend", required=True, help="an installed edgeplug backend")
    parser.add_argument("--ops", default="", help="operator files, comma-separated (add,linear); all where empty")
    parser.add_argument("--tests", default="", help="only these tests, comma-separated (test_add_dtype,...)")
    parser.add_argument("--first-of-each-file", action="store_true", help="the first test of each operator file")
    parser.add_argument("--no-stock", action="store_true", help="edgeplug's flow only")
    parser.add_argument("--lower-only", action="store_true", default=None,
                        help="stop after lowering (the default where ExecuTorch's runtime here cannot run the backend)")
    parser.add_argument("--dry-run", action="store_true", default=None,
                        help="lower as a dry run (the default where the backend cannot serialize here)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write every test's outcome and cases here")
    args = parser.parse_args(argv)

    def progress(row: SuiteRow) -> None:
        print(f"{row.test}: " + ", ".join(f"{s} {o.outcome} ({o.seconds:.1f}s)" for s, o in row.flows.items()),
              file=sys.stderr, flush=True)

    try:
        run = run_operator_tests(
            args.backend, [o for o in args.ops.split(",") if o] or None,
            tests=[t for t in args.tests.split(",") if t] or None, first_of_each_file=args.first_of_each_file,
            stock=not args.no_stock, lower_only=args.lower_only, dry_run=args.dry_run, seed=args.seed,
            progress=progress,
        )
    except EdgeplugError as exc:  # an unknown backend, operator file or test: said in one line, nothing run
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the tests done so far were printed one a line; no table, no --json file
        print(f"\n{parser.prog}: interrupted; no table printed"
              + (f" and {args.json} not written" if args.json else ""), file=sys.stderr)
        return 130
    print(run.table())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dataclasses.asdict(run), f, indent=1, default=str)
    return 1 if run.lost() else 0


__all__ = [
    "FlowOutcome", "SuiteRow", "SuiteRun", "edgeplug_flow", "edgeplug_tester", "run_command", "run_operator_tests",
    "stock_flow",
]

if __name__ == "__main__":
    sys.exit(run_command())
