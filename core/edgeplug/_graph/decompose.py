"""Export-stage decompositions of what ``to_edge`` cannot take, run by the core before it.

Each one rewrites an op that would stop every backend (executorch's verifier
refuses it, or no executorch runtime has a kernel for it) into core ATen ops,
returns a record of each node it rewrites or leaves, and is
added only when the program has such a node (``export_decompositions``; an op
the backend keeps whole is left to it, recorded as refused):

- ``decompose_histc`` (``edgeplug._graph.histc``): ``aten.histc``, bit for bit.
- ``empty_like_as_empty``: ``aten.empty_like`` of a tensor whose result is
  contiguous becomes ``aten.empty`` of the same shape and dtype. Left alone,
  ``to_edge``'s decomposition turns it into ``aten.empty_permuted``, which is
  not core ATen. Both allocate without initialising: nothing else changes.
- ``grouped_mm_as_bmm``: transformers' ``transformers::grouped_mm_fallback``
  (a custom op, the mixture-of-experts matmul of each expert's sorted rows,
  with no executorch kernel): row ``s`` belongs to expert ``e(s)``, the number
  of offsets ``<= s``; it becomes a batched matmul of each row with its
  expert's weight, and rows past the last offset are zero, as the op leaves
  them. Every output element is the same dot product; only the order in
  which a matmul kernel sums it may differ.
- ``sort_as_ranks``: ``aten.sort`` of a small 1-D integer tensor, ascending
  (no executorch runtime has a ``sort`` kernel): each element's place is
  the number of smaller elements plus the number of equal ones before it,
  a stable sort. The values are torch's; the indices of equal keys keep
  their order, one of the orders ``torch.sort`` allows (its CPU kernel
  picks another one; a model must not depend on it).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.export import ExportedProgram

from edgeplug._graph.histc import HISTC, decompose_histc
from edgeplug._graph.histc import TRANSFORM as HISTC_TRANSFORM
from edgeplug._graph.ops import op_name
from edgeplug._graph.passes import PassResult, core_pass
from edgeplug._graph.rewrite import replace_with_traced
from edgeplug._records import TransformRecord

EMPTY_LIKE = "aten.empty_like.default"
GROUPED_MM = "transformers.grouped_mm_fallback.default"
SORT = "aten.sort.default"
#: the largest n x n comparison table sort_as_ranks builds
MAX_SORT_TABLE = 2**20


def _calls(ep: ExportedProgram, op: str) -> list[torch.fx.Node]:
    return [n for n in ep.graph_module.graph.nodes if n.op == "call_function" and op_name(n) == op]


def _record(transform: str, node: str, op: str, added: list, detail: str) -> TransformRecord:
    return TransformRecord(transform=transform, kind="rewrite", node=node, op=op, added=len(added), detail=detail)


def _refuse(transform: str, node: torch.fx.Node, op: str, reason: str) -> TransformRecord:
    return TransformRecord(
        transform=transform, kind="rewrite", node=node.name, op=op, outcome="refused", removed=0,
        detail=f"left as it is: {reason}",
    )


def empty_like_as_empty(ep: ExportedProgram) -> list[TransformRecord]:
    """``aten.empty_like`` whose result is contiguous -> ``aten.empty`` of its shape and dtype (in place)."""
    records = []
    for node in _calls(ep, EMPTY_LIKE):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or not val.is_contiguous():
            records.append(_refuse("empty_like_as_empty", node, EMPTY_LIKE, "its result is not a contiguous tensor"))
            continue
        shape, dtype, device = tuple(val.shape), val.dtype, val.device
        name = node.name
        added = replace_with_traced(node, lambda: torch.empty(shape, dtype=dtype, device=device), ())  # noqa: B023 (traced now)
        records.append(_record("empty_like_as_empty", name, EMPTY_LIKE, added, f"empty {list(shape)} {dtype}"))
    return records


def _grouped_mm(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    experts = weight.shape[0]
    rows = torch.arange(x.shape[0], dtype=offs.dtype)
    expert = (offs.unsqueeze(0) <= rows.unsqueeze(1)).to(torch.int64).sum(1)  # e(s); == experts past the last offset
    w = weight[torch.clamp(expert, max=experts - 1)]  # [S, in, out]
    y = torch.bmm(x.unsqueeze(1), w).squeeze(1)
    return torch.where((expert < experts).unsqueeze(1), y, torch.zeros((), dtype=y.dtype))


def grouped_mm_as_bmm(ep: ExportedProgram) -> list[TransformRecord]:
    """``transformers::grouped_mm_fallback(x, w, offs)`` -> a batched matmul per row (in place)."""
    records = []
    for node in _calls(ep, GROUPED_MM):
        x, w, offs = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in node.args[:3])
        if not all(isinstance(t, torch.Tensor) for t in (x, w, offs)):
            records.append(_refuse("grouped_mm_as_bmm", node, GROUPED_MM, "an operand has no tensor value"))
            continue
        if x.dim() != 2 or w.dim() != 3 or offs.dim() != 1 or not all(isinstance(d, int) for d in (*x.shape, *w.shape)):
            records.append(_refuse("grouped_mm_as_bmm", node, GROUPED_MM, "shapes are not static (S, in), (E, in, out), (E,)"))
            continue
        name = node.name
        added = replace_with_traced(node, _grouped_mm, node.args[:3])
        records.append(_record(
            "grouped_mm_as_bmm", name, GROUPED_MM, added,
            f"{x.shape[0]} rows over {w.shape[0]} experts: each row times its expert's weight; rows past the last offset 0",
        ))
    return records


def _stable_sort(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = keys.shape[0]
    order = torch.arange(n)
    before = keys.unsqueeze(0) < keys.unsqueeze(1)  # [s, t]: keys[t] < keys[s]
    tie_before = torch.logical_and(keys.unsqueeze(0) == keys.unsqueeze(1), order.unsqueeze(0) < order.unsqueeze(1))
    place = torch.logical_or(before, tie_before).to(torch.int64).sum(1)  # a permutation of 0..n-1
    indices = ((place.unsqueeze(0) == order.unsqueeze(1)).to(torch.int64) * order.unsqueeze(0)).sum(1)
    return keys[indices], indices


def sort_as_ranks(ep: ExportedProgram) -> list[TransformRecord]:
    """Ascending ``aten.sort`` of a small static 1-D integer tensor -> a stable sort by counting (in place)."""
    records = []
    for node in _calls(ep, SORT):
        x = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", -1)
        descending = node.args[2] if len(node.args) > 2 else node.kwargs.get("descending", False)
        reason = None
        if not isinstance(x, torch.Tensor) or x.dim() != 1 or not isinstance(x.shape[0], int):
            reason = "not a static 1-D tensor"
        elif x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            reason = f"dtype {x.dtype} (integer keys only: no NaN ordering to reproduce)"
        elif descending or dim not in (0, -1):
            reason = f"descending={descending}, dim={dim}"
        elif x.shape[0] ** 2 > MAX_SORT_TABLE:
            reason = f"{x.shape[0]} elements: the comparison table would exceed {MAX_SORT_TABLE} entries"
        if reason is not None:
            records.append(_refuse("sort_as_ranks", node, SORT, reason))
            continue
        name = node.name
        added = replace_with_traced(node, _stable_sort, (node.args[0],))
        records.append(_record(
            "sort_as_ranks", name, SORT, added,
            f"{x.shape[0]} {x.dtype} keys: stable (equal keys keep their order, which torch.sort leaves open)",
        ))
    return records


#: (op, transform, what rewrites it in place), in the order they run
DECOMPOSITIONS: tuple[tuple[str, str, Callable[[ExportedProgram], list[TransformRecord]]], ...] = (
    (HISTC, HISTC_TRANSFORM, decompose_histc),
    (EMPTY_LIKE, "empty_like_as_empty", empty_like_as_empty),
    (GROUPED_MM, "grouped_mm_as_bmm", grouped_mm_as_bmm),
    (SORT, "sort_as_ranks", sort_as_ranks),
)


def _kept_whole(op: str, transform: str) -> Callable[[ExportedProgram], PassResult]:
    def refuse(ep: ExportedProgram) -> PassResult:
        return PassResult(ep, tuple(_refuse(transform, node, op, "the backend keeps it whole") for node in _calls(ep, op)))

    return refuse


def _in_place(fn: Callable[[ExportedProgram], list[TransformRecord]]) -> Callable[[ExportedProgram], PassResult]:
    def run(ep: ExportedProgram) -> PassResult:
        return PassResult(ep, tuple(fn(ep)))

    return run


def export_decompositions(ep: ExportedProgram, backend: Any) -> list[Any]:
    """The core's export-stage passes ``ep`` needs, one per op it calls (a scan: none for most programs).

    An op ``backend`` keeps whole (``edgeplug_keep_whole``) is left to it,
    each node with a refused record.
    """
    kept = {op_name(op) for op in getattr(backend, "keep_whole", ())}
    present = {op_name(n) for n in ep.graph_module.graph.nodes if n.op == "call_function"}
    return [
        core_pass(transform, _kept_whole(op, transform) if op in kept else _in_place(fn), stage="export")
        for op, transform, fn in DECOMPOSITIONS
        if op in present
    ]


__all__ = [
    "DECOMPOSITIONS", "EMPTY_LIKE", "GROUPED_MM", "SORT", "empty_like_as_empty", "export_decompositions", "grouped_mm_as_bmm",
    "sort_as_ranks",
]
