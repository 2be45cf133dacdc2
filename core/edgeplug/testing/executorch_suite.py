"""ExecuTorch's backend test suite through edgeplug's lowering (issue 45).

The executorch wheel ships the suite ExecuTorch holds its own backends to: operator and model tests
(``executorch.backends.test.suite``), each run as a *flow* (``TestFlow``) through a ``Tester`` whose stages export,
lower, ``to_executorch``, serialize, run the ``.pte`` and compare with eager. ``edgeplug_flow(backend)`` is such a
flow for any installed edgeplug backend: the suite's own stages, with only the lowering stage replaced by
``edgeplug.lower`` (a real lowering, its ETRecord kept, as the suite's runner reads it for its op counts).
``edgeplug.lower`` returns the edge-dialect program it partitioned, so the suite's ``to_executorch`` runs on it as it
would on stock's.

One difference is stated rather than hidden: where edgeplug refuses a program up front because an op outside
core ATen would run on the CPU with no ExecuTorch kernel (``NoCpuKernelError``), the case is *skipped* with that
reason, as the suite skips stock's case once its lowering shows such an op left undelegated.

- ``edgeplug_flow``: ``edgeplug_flow(backend, *, name=None, skip_patterns=())``, the suite's ``TestFlow`` lowering
  with edgeplug for ``backend`` (named ``edgeplug-BACKEND``).
- ``edgeplug_tester``: ``edgeplug_tester(backend)``, that flow's ``tester_factory``: ExecuTorch's ``Tester`` with
  edgeplug's lowering stage, for a flow of your own (quantized, other skip patterns).
- ``stock_flow``: ``stock_flow(backend)``, the suite's own float flow for the backend (what stock ExecuTorch runs).

``bench/executorch_suite.py`` runs a set of the suite's operator files through edgeplug's flow and stock's flow
of the same backend, side by side, and prints the table docs/benchmarks.md keeps.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from edgeplug._errors import EdgeplugError


def _stage(backend: str, example_inputs: tuple) -> Any:
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
                # the ETRecord always: the suite's runner counts delegated ops from it
                self.result = lower(artifact, tuple(example_inputs), backend, etrecord=True, model_name="suite case")
            except NoCpuKernelError as exc:
                import pytest  # only inside a pytest run, where the suite's cases skip

                pytest.skip(f"edgeplug refused it up front: {exc}")

        @property
        def artifact(self) -> Any:
            return self.result.edge

        @property
        def graph_module(self) -> Any:
            return self.result.edge.exported_program().graph_module

    return EdgeplugLowering()


def edgeplug_tester(backend: str) -> Callable[..., Any]:
    """A ``tester_factory`` for a ``TestFlow``: ExecuTorch's ``Tester`` with edgeplug's lowering stage."""
    # executorch's test harness: loaded when a flow is built (pytest imports edgeplug.testing at startup)
    from executorch.backends.test.harness import Tester
    from executorch.backends.test.harness.stages import StageType  # as above

    def factory(module: Any, example_inputs: tuple, dynamic_shapes: Optional[Any] = None) -> Any:
        stages = Tester.default_stage_classes() | {
            StageType.TO_EDGE_TRANSFORM_AND_LOWER: lambda *a, **k: _stage(backend, example_inputs),
        }
        return Tester(module, example_inputs, stage_classes=stages, dynamic_shapes=dynamic_shapes)

    return factory


def edgeplug_flow(backend: str, *, name: Optional[str] = None, skip_patterns: tuple[str, ...] = ()) -> Any:
    """A ``TestFlow`` of ExecuTorch's backend test suite that lowers with edgeplug for ``backend`` (float, not
    quantized). ``name`` defaults to ``edgeplug-BACKEND``; ``skip_patterns`` as the suite's flows take them."""
    # executorch's test suite and the façade: loaded when a flow is built (pytest imports edgeplug.testing at startup)
    from executorch.backends.test.suite.flow import TestFlow

    from edgeplug._facade import resolve  # as above

    resolve(backend, "edgeplug.testing.executorch_suite.edgeplug_flow")  # an unknown backend is refused here, naming the installed ones
    return TestFlow(
        name or f"edgeplug-{backend}", backend=backend, tester_factory=edgeplug_tester(backend),
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


__all__ = ["edgeplug_flow", "edgeplug_tester", "stock_flow"]
