"""Stock ExecuTorch beside edgeplug: the model lowered with the backend's own executorch partitioner
alone, as a user of executorch would (``to_edge_transform_and_lower``), and its partitioning described
in the report's own record (``StockPartitioning``: what ``edgeplug lower --compare-stock`` adds).

Importing this module loads neither torch nor executorch (the CLI imports it at startup).
"""

from __future__ import annotations

import copy
import operator
from collections import Counter
from typing import Any, Callable, Optional, Sequence

from edgeplug._backend import Backend, given_backend
from edgeplug._failures import first_line
from edgeplug._report.records import CpuNode, PartitionSummary, StockPartitioning, annotate_graph, graph_of
from edgeplug._shape_env import kept_shape_envs


def stock_factory(backend: Backend) -> tuple[Optional[Callable[[], Any]], str]:
    """(what builds the stock flow's partitioner, '') or (None, why there is no stock flow).

    The backend's ``BackendSpec.stock_partitioner`` where it names one; else its own partitioner where that is
    an ExecuTorch class (a subclass or wrapper of the plugin's, or a support-table stand-in, is not stock)."""
    if backend.spec.stock_partitioner is not None:
        return backend.spec.stock_partitioner, ""
    inner = type(backend.make_partitioner())
    if inner.__module__.startswith("executorch."):
        return backend.make_partitioner, ""
    return None, (
        f"backend {backend.name!r} partitions with {inner.__module__}.{inner.__qualname__}, not an executorch "
        "partitioner: no stock flow to compare with (a backend whose partitioner subclasses or wraps executorch's "
        "names the stock one: BackendSpec.stock_partitioner)"
    )


def stock_partitioning(model_or_ep: Any, example_inputs: Sequence[Any], backend: Backend) -> StockPartitioning:
    """Lower the model with the backend's own executorch partitioner alone (executorch's
    ``to_edge_transform_and_lower``, as a user of executorch would) and describe its partitioning.

    A backend whose partitioner is not executorch's has no stock flow; a stock flow
    that fails is described, not raised: ``StockPartitioning.error`` says which.
    """
    b = given_backend(backend, "edgeplug._stock.stock_partitioning")
    factory, absent = stock_factory(b)
    inner = factory() if factory is not None else b.make_partitioner()
    flow = f"executorch.exir.to_edge_transform_and_lower(ep, partitioner=[{type(inner).__name__}()])"
    if factory is None:
        return StockPartitioning(flow=flow, error=absent)
    try:
        edge_ep, seen = _stock_lowering(model_or_ep, example_inputs, inner)
    except Exception as exc:
        return StockPartitioning(flow=flow, error=f"the stock flow failed: {first_line(exc)}")
    why = f"not delegated by {type(inner).__name__} (the stock flow records no reason)"
    return partitioning_of(edge_ep, why, flow=flow, seen=seen)


def _stock_lowering(model_or_ep: Any, example_inputs: Sequence[Any], partitioner: Any) -> tuple[Any, list]:
    """The stock flow on a copy of the model: its lowered edge program, and the graph its partitioner was given."""
    # torch and executorch: the CLI starts, and reads reports, without them
    import torch
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
    from executorch.exir.pass_manager import ExportedProgramPassManager

    seen: list = []

    class _Snapshot(ExportedProgramPassBase):  # changes nothing: records the graph the partitioner gets
        def call(self, exported_program: Any) -> ExportedProgramPassResult:
            seen[:] = graph_of(exported_program)
            return ExportedProgramPassResult(exported_program, False)

    if isinstance(model_or_ep, torch.export.ExportedProgram):
        ep = copy.deepcopy(model_or_ep)
    else:
        model = copy.deepcopy(model_or_ep)
        for p in model.parameters():
            p.requires_grad_(False)
        with torch.no_grad():
            ep = torch.export.export(model, copy.deepcopy(tuple(example_inputs)))
    with kept_shape_envs(model_or_ep):  # stock's trace leaves symbols pending in the caller's ShapeEnv
        edge = to_edge_transform_and_lower(ep, transform_passes=ExportedProgramPassManager([_Snapshot()]), partitioner=[partitioner])
    return edge.exported_program(), seen


def partitioning_of(edge_ep: Any, why: str, *, flow: str = "", seen: Optional[list] = None) -> StockPartitioning:
    """A program stock executorch lowered, as the report's record: its partitions, each node left on the CPU
    (``why``), and, given the graph its partitioner saw (``seen``), that graph by partition. What
    ``--compare-stock`` shows and the zoo's stock column counts (before ``to_executorch``, which rewrites
    the program in place)."""
    # executorch: loaded when a stock flow runs (the CLI imports this module at startup)
    from edgeplug._lowered import count_delegated, lowered_partitions
    from edgeplug._partition import op_name

    parts, delegated = count_delegated(edge_ep)
    gm = edge_ep.graph_module
    cpu_nodes = [
        CpuNode(node=n.name, op=op_name(n.target), reason=why) for n in gm.graph.nodes
        if n.op == "call_function" and n.target is not operator.getitem and "executorch_call_delegate" not in str(n.target)
    ]
    graph = annotate_graph(seen, lowered_partitions(gm), {c.node: c.reason for c in cpu_nodes}) if seen is not None else []
    return StockPartitioning(
        flow=flow, partitions=[PartitionSummary(**p.model_dump()) for p in parts], delegated_ops=dict(delegated),
        cpu_ops=dict(Counter(c.op for c in cpu_nodes)), cpu_nodes=cpu_nodes, graph=graph,
    )
