"""The two lowerings of a cell: edgeplug's (``lower_edgeplug``) and stock executorch's (``lower_stock``).

``target`` says how a backend's cells run (a real lowering or a dry run, and
whether a stock flow exists), from what its plugin declares; each lowering
is timed (serialization included, verification not) and counted as
edgeplug's report counts: partitions, and the nodes left on the CPU by op.
"""

from __future__ import annotations

import copy
import gc
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional


import torch
import torch.utils._pytree as pytree

from edgeplug import _executorch
from edgeplug._failures import first_line
from edgeplug._registry.lookup import get_backend
from edgeplug._stock import partitioning_of, stock_factory
from edgeplug._zoo._record import Side


@dataclass(frozen=True)
class CellTarget:
    """How a backend's cell runs: a real lowering against stock, or a dry run."""

    dry_run: bool
    stock: Optional[Callable[[], Any]]  # executorch's own partitioner, or None
    stock_absent: str = ""  # why there is no stock column
    #: the stock .pte runs in executorch's Python runtime (the backend's own programs do: verify_method "pte")
    stock_runs_here: bool = False


def dry_run(backend: str) -> bool:
    """Whether ``backend``'s cells are dry runs (its delegate cannot serialize here), without building its
    partitioner: what a cell that never reported (a timeout, a lost process) is recorded with."""
    return not get_backend(backend).availability().ok


def target(backend: str) -> CellTarget:
    """How ``backend``'s cells run, from what its plugin declares (the core names no backend).

    A real lowering where its delegate serializes here, else a dry run. The stock flow is
    executorch's ``to_edge_transform_and_lower`` with the partitioner the plugin builds, used alone,
    where that partitioner is executorch's own class (a support-table stand-in is not a stock flow).
    """
    b = get_backend(backend)
    available = b.availability()
    if not available.ok:
        return CellTarget(True, None, f"its SDK is absent here ({available.reason}): stock cannot run here")
    factory, absent = stock_factory(b)  # BackendSpec.stock_partitioner, else its own where it is executorch's
    if factory is None:
        return CellTarget(False, None, absent)
    return CellTarget(False, factory, stock_runs_here=b.spec.verify_method == "pte")


def stock_graph_breaks(edge_ep: Any) -> tuple[int, Counter]:
    """(partitions, CPU ops) of a program stock executorch lowered: its ``edgeplug._stock.partitioning_of``
    record, counted as edgeplug's report counts."""
    record = partitioning_of(edge_ep, "")
    return len(record.partitions), Counter(record.cpu_ops)


def cell_error(exc: BaseException) -> str:
    """What a cell records of a failure: its first line (``edgeplug._failures.first_line``), at most 300 characters."""
    return first_line(exc)[:300]


def _flat(out: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def lower_edgeplug(
    ep: Any, inputs: tuple, backend: str, dry_run: bool, model_name: str, verify: bool = True,
    kwargs: Optional[dict] = None,
) -> tuple[Side, Any]:
    """edgeplug.lower (timed, serialization included) then edgeplug.verify where it runs."""
    # the lowering (executorch): only a cell's process lowers; the parent imports this module for dry_run
    from edgeplug._facade import lower
    from edgeplug._facade import verify as verify_lowered

    side = Side()
    try:
        gc.collect()  # each timed lowering starts from a collected heap, stock's and edgeplug's alike
        t = time.perf_counter()
        result = lower(
            copy.deepcopy(ep), inputs, backend, kwargs=kwargs or None, dry_run=dry_run, model_name=model_name
        )
        side.seconds = time.perf_counter() - t
    except Exception as exc:
        side.error, side.stage = cell_error(exc), "lower"
        return side, None
    report = result.report
    side.ok = True
    if result.program is not None:
        side.pte_bytes = len(result.buffer)
    side.partitioned(report)
    if verify and not dry_run and get_backend(backend).spec.verify_method == "none":
        side.verify_method = "none"  # no runtime for its programs on this host (coreml off Apple): not a failure
    elif verify and not dry_run:
        try:
            t = time.perf_counter()
            v = verify_lowered(result, backend)
            side.verify_seconds = time.perf_counter() - t
            side.max_abs_diff = v.max_abs_diff
            side.verify_method = v.method + (f" on {v.adapter}" if v.adapter else "")
            if hasattr(v, "passed"):
                side.verify_passed = bool(v.passed)
                side.verify_problems = list(v.failures()) if not v.passed else []
            q = result.report.quantization
            if q is not None and q.cosine_to_float:  # the lowered program against the float model
                side.cosine_to_float, side.max_abs_float = q.cosine_to_float[0], q.versus_float[0]
                if q.quantized_cosine_to_float:
                    side.quantized_cosine = q.quantized_cosine_to_float[0]
        except Exception as exc:
            side.verify_error = cell_error(exc)
    return side, result


def lower_stock(
    ep: Any, inputs: tuple, eager: list, target: CellTarget, keep: Optional[dict] = None,
    float_outputs: Optional[list] = None,
) -> Side:
    """executorch's to_edge_transform_and_lower with the backend's own partitioner, then to_executorch.

    ``eager``: the outputs the .pte should give (where it runs here); ``float_outputs``: the float model's,
    for a quantized program's cosine and max |Δ| to float; ``keep``: a dict that receives the serialized
    program as ``"buffer"`` (to time it later)."""
    # executorch: as in lower_edgeplug, only a cell's process lowers
    from executorch.exir import to_edge_transform_and_lower

    side = Side()
    stage = "to_edge_transform_and_lower"
    try:
        gc.collect()
        t = time.perf_counter()
        edge = to_edge_transform_and_lower(copy.deepcopy(ep), partitioner=[target.stock()])
        paused = time.perf_counter()
        # counted before to_executorch, which rewrites the program in place (out variants, allocs)
        side.partitioned(partitioning_of(edge.exported_program(), ""), reasons=False)
        resumed = time.perf_counter()
        stage = "to_executorch"
        buffer = edge.to_executorch().buffer
        side.seconds = time.perf_counter() - t - (resumed - paused)
    except Exception as exc:
        side.error, side.stage = cell_error(exc), stage
        return side
    side.ok = True
    side.pte_bytes = len(buffer)
    if keep is not None:
        keep["buffer"] = buffer
    if target.stock_runs_here:  # a delegate executorch's Python runtime runs (the backend verifies .pte files)
        try:
            # executorch's runtime (a native library): only where a stock .pte is run here

            if not eager:
                return side
            outs = _flat(_executorch.load_pte(buffer).forward(tuple(inputs)))
            side.max_abs_diff = max(
                (a.double() - e.double()).abs().max().item() for a, e in zip(outs, eager)
            )
            side.verify_method = "pte"
            if float_outputs:
                side.cosine_to_float, side.max_abs_float = versus_float(outs[0], float_outputs[0])
        except Exception as exc:
            side.stage = "run"
            side.verify_error = cell_error(exc)
    return side


def versus_float(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(cosine similarity, max |out - ref|) of a program's first output against the float model's."""
    a, b = out.detach().double().flatten(), ref.detach().double().flatten()
    return torch.nn.functional.cosine_similarity(a, b, dim=0).item(), (a - b).abs().max().item()
