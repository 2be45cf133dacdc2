"""edgeplug's strict IR check, as a stated policy (issue 49).

ExecuTorch's ``to_edge`` can verify that the program it makes holds core ATen ops only
(``EdgeCompileConfig(_check_ir_validity=True)``). Its own flows (the backend test suite's among them) turn
the check off; edgeplug keeps it on, so that an op a transform of the core or of a plugin creates where it
is not valid fails at ``to_edge``, naming that transform, in a real lowering and a dry run alike. Keeping it on
is edgeplug's choice, so:

- **An op the model holds that is not core ATen is let through** (``ops_outside_core_aten`` lists them,
  ``edge_compile_config`` hands them to the check as its exceptions), as stock's flow lets it through: the
  backend's partitioner may delegate it (Core ML takes ``aten.adaptive_max_pool2d``). Ops a transform created
  are never in that list: the check still refuses those, naming the transform.
- **Such an op left on the CPU without a kernel is refused up front** (``refuse_without_cpu_kernel``, after
  partitioning, before serialization): ExecuTorch's portable kernel library (the kernels every ExecuTorch
  runtime links, listed in the ``kernels/portable/functions.yaml`` the executorch wheel ships) has no out
  variant for it, so the ``.pte`` would fail to load ("Missing operator"). The error names the op, the node,
  why the backend did not take it and what to do. Where the wheel does not ship the list, nothing is refused.
- **A failure of the check itself is edgeplug's to answer for** (``edgeplug._failures``), never blamed on
  ExecuTorch.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Mapping, Optional

import torch
from torch._guards import detect_fake_mode
from torch.fx.experimental.proxy_tensor import make_fx

from edgeplug._errors import LoweringError
from edgeplug._graph.ops import aten_overload, op_name


class NoCpuKernelError(LoweringError):
    """An op outside core ATen that the backend does not take would run on the CPU, where no ExecuTorch kernel
    runs it: refused before serialization, naming the op (the message says what to do)."""


def _outside_core_aten(target: Any) -> bool:
    op = aten_overload(target)
    return isinstance(op, torch._ops.OpOverload) and op.namespace == "aten" and torch.Tag.core not in op.tags


def ops_outside_core_aten(ep: Any, created: Optional[Mapping[str, str]] = None) -> list[Any]:
    """The aten ops outside core ATen that the model brings to the check, none a transform created
    (``created``: op name -> the transform that brought it in, as ``run_passes`` collects it): the check's
    exceptions. They are the program's own such ops and those ``to_edge``'s decompositions of its ops make
    (``aten.adaptive_max_pool1d`` becomes ``aten.adaptive_max_pool2d``). An op decomposed anyway is harmless here."""
    from edgeplug._executorch import default_decompositions  # loads executorch: only a lowering does (import edgeplug stays light)

    table = default_decompositions()
    made = set(created or ())
    found: dict[str, Any] = {}
    traced: set[Any] = set()
    for node in ep.graph_module.graph.nodes:
        if node.op != "call_function" or op_name(node.target) in made:
            continue
        ops = [node.target]
        if node.target in table and node.target not in traced:  # what its decomposition brings, once per op
            traced.add(node.target)
            ops += _decomposed_into(node, table)
        for op in ops:
            if _outside_core_aten(op):
                found.setdefault(op_name(op), aten_overload(op))
    return list(found.values())


class _Slot:
    def __init__(self, index: int) -> None:
        self.index = index


def _decomposed_into(node: Any, table: Mapping[Any, Any]) -> list[Any]:
    """The ops ``to_edge``'s decomposition table turns ``node`` into, traced on its example values (empty where it
    cannot be traced: the check then judges what comes out)."""
    values: list[Any] = []

    def slot(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            values.append(a.meta.get("val"))
            return _Slot(len(values) - 1)
        return a

    args, kwargs = torch.fx.node.map_aggregate(node.args, slot), torch.fx.node.map_aggregate(node.kwargs, slot)
    if not all(isinstance(v, torch.Tensor) for v in values):
        return []

    def call(*tensors: Any) -> Any:
        def put(a: Any) -> Any:
            return tensors[a.index] if isinstance(a, _Slot) else a

        return node.target(*torch.fx.node.map_aggregate(args, put), **torch.fx.node.map_aggregate(kwargs, put))

    try:
        with detect_fake_mode(values) or contextlib.nullcontext():
            # detached, as to_edge's retrace sees them (a weight that requires grad picks other kernels:
            # aten.embedding_bag becomes aten._embedding_bag there, _embedding_bag_forward_only in to_edge)
            gm = make_fx(call, decomposition_table=table)(*[v.detach() for v in values])
    except Exception:
        return []
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def edge_compile_config(allowed: Iterable[Any]) -> Any:
    """``to_edge``'s config: the strict IR check, with the model's own ops outside core ATen (``allowed``) let
    through (``_core_aten_ops_exception_list``, the field ExecuTorch's verifier names for exactly this)."""
    from edgeplug._executorch import strict_edge_compile_config  # executorch: only a lowering loads it

    return strict_edge_compile_config(list(allowed))


def portable_kernels() -> Optional[frozenset[str]]:
    """The ops ExecuTorch's portable kernel library implements, as ``"name.overload"`` of each out variant
    (``"round.out"``); None where the executorch wheel ships no list of them."""
    from edgeplug._executorch import portable_kernel_ops  # reads executorch's package data: only a lowering does

    return portable_kernel_ops()


def out_variant(op: Any) -> Optional[str]:
    """The out variant a CPU kernel of ``op`` must implement, as the kernel list names it (``"round.decimals_out"``),
    or None where ExecuTorch finds none."""
    from executorch.exir.operator.convert import to_out_variant  # executorch: only a lowering loads it

    try:
        out, _args = to_out_variant(op)
    except Exception:
        return None
    return f"{out._schema.name.split('::')[-1]}.{out._overloadname}"


#: ops outside core ATen that ExecuTorch removes before its runtime sees the program (shape and value asserts of
#: dynamic shapes, data-dependent sizes): never run on the CPU, so no kernel is missing for them
REMOVED_BEFORE_RUNTIME = frozenset({
    "_assert_scalar", "_assert_async", "_assert_tensor_metadata", "sym_constrain_range", "sym_constrain_range_for_size",
})


def without_cpu_kernel(ep: Any, allowed: Iterable[Any]) -> list[tuple[Any, str, str]]:
    """``(node, op name, out variant)`` for each node of the lowered ``ep`` (its top-level graph: what runs on
    the CPU) whose op is one of ``allowed`` and has no portable kernel; empty where the kernel list is unknown."""
    kernels = portable_kernels()
    allowed = set(allowed)
    if kernels is None or not allowed:
        return []
    found = []
    for node in ep.graph_module.graph.nodes:
        if node.op != "call_function" or aten_overload(node.target) not in allowed:
            continue
        if op_name(node.target).split(".")[1] in REMOVED_BEFORE_RUNTIME:
            continue  # to_executorch drops it (ExecuTorch's RemoveGraphAssertsPass): no kernel needed
        out = out_variant(aten_overload(node.target))
        if out is None or out not in kernels:
            found.append((node, op_name(node.target), out or "an out variant"))
    return found


def refuse_without_cpu_kernel(ep: Any, allowed: Iterable[Any], backend: str, cpu_reasons: Mapping[str, str]) -> None:
    """Raise ``NoCpuKernelError`` where an op the check let through is left on the CPU without a kernel."""
    found = without_cpu_kernel(ep, allowed)
    if not found:
        return
    lines = "; ".join(
        f"node {node.name!r} ({op}): {cpu_reasons.get(node.name) or f'backend {backend!r} does not take it'}, and "
        f"ExecuTorch's portable kernels have no {out}"
        for node, op, out in found
    )
    ops = sorted({op for _node, op, _out in found})
    err = NoCpuKernelError(
        f"the model holds {', '.join(ops)}, outside core ATen, which would run on the CPU where no ExecuTorch "
        f"kernel runs it (the .pte would fail to load: 'Missing operator'): {lines}. Fix: express it with "
        "core ATen ops in the model, or lower for a backend that delegates it; nothing was written"
    )
    err.at_fault = "the model"
    raise err


__all__ = [
    "NoCpuKernelError", "edge_compile_config", "ops_outside_core_aten", "out_variant", "portable_kernels",
    "refuse_without_cpu_kernel", "without_cpu_kernel",
]
