"""``aten.histc`` as core ATen ops, where the result is provably the same.

``torch.export`` keeps ``aten.histc`` (transformers' mixture-of-experts
routing counts the tokens sent to each expert with
``histc(ids.float(), bins=num_experts, min=0, max=num_experts - 1)``), and
``histc`` is not in the core ATen opset: executorch's ``to_edge`` verifier
refuses the program, for every backend. The core rewrites it on the aten
program, before ``to_edge``, into ops every backend's partitioner knows.

What torch's CPU kernel computes, and the decomposition reproduces: the bin
edges are ``linspace(min, max, bins + 1)`` in the input's dtype; an element
counts only if ``edges[0] <= x <= edges[-1]`` (NaN and values outside are
ignored); its bin is ``trunc((x - edges[0]) * bins / (edges[-1] - edges[0]))``
computed in the input's dtype, the value ``bins`` (x at the top edge) going
to the last bin; a bin holds the number of elements in it, in the input's
dtype. The decomposition computes the same bin index with the same rounding
steps, finds the bin ``b`` with ``b <= q < b + 1`` (``trunc`` on these
non-negative values) and sums the matches of each bin.

It refuses (leaves ``histc`` and records why, so ``to_edge``'s error stays
executorch's) where it cannot prove equality: ``min == max`` (torch then
takes the range from the data), a range that is empty, infinite or
overflows in the input's dtype, dtypes other than float32 / float64 (the
half-precision kernel rounds differently), a symbolic element count, counts
a float cannot hold exactly, or a one-hot comparison too large to build.
A backend that keeps ``aten.histc`` whole (``edgeplug_keep_whole``) keeps it.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional

import torch
from torch.export import ExportedProgram

from edgeplug._graph.ops import op_name
from edgeplug._graph.rewrite import replace_with_traced
from edgeplug._records import TransformRecord

TRANSFORM = "decompose_histc"
HISTC = "aten.histc.default"

#: dtype -> the largest element count whose per-bin counts the dtype holds exactly
_EXACT_COUNT = {torch.float32: 2**24, torch.float64: 2**53}
#: the largest elements x bins comparison table the decomposition builds
MAX_TABLE = 2**24


def _histc_counts(x: torch.Tensor, bins: int, low: float, high: float, span: float) -> torch.Tensor:
    flat = x.reshape(-1)
    inside = torch.logical_and(flat >= low, flat <= high)  # False for NaN
    # torch's bin formula, step by step in x's dtype (the top edge gives ``bins``: capped to the
    # last bin); trunc(q) == b is b <= q < b + 1 on these q >= 0, compared exactly (no floor:
    # Vulkan has none), bins along dim 0 so the count is a last-dim sum
    position = torch.clamp((flat - low) * bins / span, max=bins - 1)
    first = torch.arange(bins, dtype=x.dtype).unsqueeze(1)
    hits = torch.logical_and(torch.logical_and(position >= first, position < first + 1), inside)
    return hits.to(x.dtype).sum(-1)


def _number(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def histc_refusal(x: Any, bins: Any, low: Any, high: Any) -> Optional[str]:
    """Why ``histc(x, bins, low, high)`` cannot be decomposed exactly (``x`` a tensor or fake tensor), or None."""
    lo, hi = _number(low), _number(high)
    if not isinstance(bins, int) or isinstance(bins, bool) or lo is None or hi is None:
        return f"bins={bins!r}, min={low!r}, max={high!r} are not compile-time numbers"
    if not isinstance(x, torch.Tensor):
        return "the input has no tensor value"
    if x.dtype not in _EXACT_COUNT:
        return f"input dtype {x.dtype} (only float32 and float64 are reproduced bit for bit)"
    if bins < 1:
        return f"bins={bins} (torch raises for it at run time)"
    if lo == hi:
        return f"min == max ({lo:g}): torch takes the range from the data at run time"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"min={lo!r}, max={hi!r}: the range is not finite"
    edges = torch.linspace(lo, hi, bins + 1, dtype=x.dtype)
    span = edges[-1] - edges[0]
    if not (bool(span > 0) and bool(torch.isfinite(span * bins))):
        return f"min={lo:g}, max={hi:g} in {x.dtype}: the range is empty or its bin arithmetic overflows"
    numel = x.numel()
    if not isinstance(numel, int):
        return f"the element count {numel} is symbolic (counts are exact only up to {_EXACT_COUNT[x.dtype]})"
    if numel >= _EXACT_COUNT[x.dtype]:
        return f"{numel} elements: a {x.dtype} count is exact only below {_EXACT_COUNT[x.dtype]}"
    if numel * bins > MAX_TABLE:
        return f"{numel} elements x {bins} bins: the comparison table would exceed {MAX_TABLE} entries"
    return None


def decompose_histc(ep: ExportedProgram, *, keep_whole: Iterable[Any] = ()) -> list[TransformRecord]:
    """Replace each ``aten.histc`` of ``ep`` (aten dialect) by core ATen ops, in place; the records.

    Each node is either decomposed (``outcome="applied"``) or left with a
    reason (``outcome="refused"``); it returns a record for each.
    ``keep_whole``: the backend's kept-whole ops; ``aten.histc`` among them
    refuses every node. Run it through the pass runner (names reserved,
    graph linted and recompiled afterwards).
    """
    kept = any(op_name(op) == HISTC for op in keep_whole)
    records = []
    for node in [n for n in ep.graph_module.graph.nodes if _is_histc(n)]:
        x, bins, low, high = _arguments(node)
        reason = "the backend keeps aten.histc whole" if kept else histc_refusal(x.meta.get("val"), bins, low, high)
        if reason is not None:
            record = TransformRecord(
                transform=TRANSFORM, kind="rewrite", node=node.name, op=HISTC, outcome="refused",
                removed=0, detail=f"left as it is: {reason}",
            )
        else:
            val = x.meta["val"]
            edges = torch.linspace(float(low), float(high), bins + 1, dtype=val.dtype)
            name = node.name
            added = replace_with_traced(
                node, _histc_counts, (x, bins, edges[0].item(), edges[-1].item(), (edges[-1] - edges[0]).item())
            )
            record = TransformRecord(
                transform=TRANSFORM, kind="rewrite", node=name, op=HISTC, added=len(added),
                detail=f"{val.numel()} {val.dtype} values, bins={bins}, min={low}, max={high}: "
                "each element's bin by torch's formula, compared with every bin number and summed",
            )
        records.append(record)
    return records


def _is_histc(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is torch.ops.aten.histc.default


def has_histc(ep: ExportedProgram) -> bool:
    """Whether ``ep``'s top-level graph calls ``aten.histc`` (a cheap scan: the pass is added only then)."""
    return any(_is_histc(n) for n in ep.graph_module.graph.nodes)


def _arguments(node: torch.fx.Node) -> tuple[Any, ...]:
    """``(input, bins, min, max)``, positional or keyword, with the schema's defaults."""
    defaults = (("bins", 100), ("min", 0), ("max", 0))
    rest = [node.args[i] if i < len(node.args) else node.kwargs.get(k, d) for i, (k, d) in enumerate(defaults, 1)]
    return (node.args[0], *rest)


__all__ = ["HISTC", "MAX_TABLE", "TRANSFORM", "decompose_histc", "has_histc", "histc_refusal"]
