"""One zoo cell: a model lowered for a backend under a scheme, with edgeplug and (on request) stock executorch.

``run_cell`` is what runs inside a cell's own process, under either executor.
Per cell: partitions, nodes left on the CPU by op (with the partitioner's
reasons), norms fused out of the norms present, max |lowered - eager| where the
backend's program runs on this host, and lowering times (serialization
included, verification not). A cell that fails carries the first line of its
error; it never raises. What a cell records is in ``_record``, the two
lowerings in ``_lowering``, what a quantized cell adds in ``_quantized``.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from functools import lru_cache
from typing import Any, Optional

import torch

from edgeplug import _executorch
from edgeplug._registry.lookup import get_backend
from edgeplug._facade import quantize
from edgeplug._records import QuantScheme
from edgeplug._zoo._lowering import CellTarget, _flat, cell_error, lower_edgeplug, lower_stock, target, versus_float
from edgeplug._zoo._models import exported_call, label
from edgeplug._zoo._stock_quantize import StageError, quantize_stock, time_ptes
from edgeplug._zoo._record import FLOAT, Cell, Side


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    # executorch's partitioners log every node at INFO: nothing below ERROR is printed. Not with
    # logging.disable, which would also drop the DEBUG records edgeplug reads a partitioner's
    # reasons from (capture_why), and every CPU node would read "it gave no reason"
    # A handler first: the basicConfig(level=INFO) some executorch modules run on import is then
    # a no-op, and cannot lower the root's level again
    logging.basicConfig(level=logging.ERROR)
    root = logging.getLogger()
    root.setLevel(logging.ERROR)
    for handler in root.handlers:
        handler.setLevel(logging.ERROR)


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) * 2.0


@lru_cache(maxsize=None)
def warm_up(backend: str) -> None:
    """Lower a tiny model both ways once per process, so neither column pays the first-use imports."""
    target_ = target(backend)
    with torch.no_grad():
        ep = torch.export.export(_Tiny().eval(), (torch.randn(2, 8),))
    inputs = (torch.randn(2, 8),)
    try:
        if target_.stock is not None:
            lower_stock(ep, inputs, [], target_)
        lower_edgeplug(ep, inputs, backend, target_.dry_run, "warm-up", verify=False)
    except Exception:
        pass  # the cell itself will say what fails


def schemes_of(backend: str) -> list[str]:
    """The quantization schemes ``backend`` declares (its plugins' QuantScheme records)."""
    return [c.record.scheme for c in get_backend(backend).contributions if isinstance(c.record, QuantScheme)]


def run_cell(
    model: str,
    backend: str,
    scheme: str = FLOAT,
    layers: Optional[int] = None,
    compare_stock: bool = True,
    warm: bool = True,
    repeat: int = 1,
) -> Cell:
    """Lower ``model`` for ``backend`` (quantized first with ``scheme`` unless float) with edgeplug,
    and with stock executorch when ``compare_stock``. Never raises.

    A quantized cell's stock side quantizes with the same quantizer (or torchao config) as executorch
    alone does (``quantize_stock``), then lowers as a float cell's does; where the backend's programs run
    here, both .pte files run in executorch's runtime against the float model and are timed alternately
    on one thread (``time_ptes``).

    ``model`` is a key ``resolve_models`` gave. ``warm``: first lower a tiny model both ways in
    this process (fair timings). ``repeat``: lower each side that many times, alternating stock and
    edgeplug, and keep each side's fastest time (the first lowering is the one verified)."""
    _quiet()
    cell = Cell(model=model, backend=backend, scheme=scheme)
    try:  # the model before the backend: a model that fails, hangs or is killed gets there without executorch
        module, ep, args, kwargs, cell.norms_present = exported_call(model, layers)
        with torch.no_grad():
            eager = _flat(module(*args, **kwargs))
    except Exception as exc:
        cell.error = "build/export: " + cell_error(exc)
    target_ = target(backend)
    cell.dry_run, cell.stock_absent = target_.dry_run, target_.stock_absent
    if not compare_stock:
        cell.stock_absent = "not compared (--compare-stock)"
    if cell.error:
        return cell
    stock = target_.stock if compare_stock else None
    try:
        cell.no_policy = get_backend(backend).fusion_policy("rms_norm") is None
    except Exception:
        pass
    program, stock_program, stock_eager = ep, ep, eager
    if scheme != FLOAT:
        program, stock_program, stock_eager, stock_goes_on = _quantize_both(
            cell, module, ep, args, kwargs, eager, compare_stock=stock is not None, warm=warm,
        )
        stock = stock if stock_goes_on else None
    elif warm:
        warm_up(backend)
    buffers = _lower_both(cell, program, stock_program, stock_eager, eager, args, kwargs, target_ if stock is not None else None)
    runs_here = get_backend(backend).spec.verify_method == "pte"
    if scheme != FLOAT and runs_here and not kwargs:
        _run_ptes(cell, buffers, args, eager)
    for _ in range(repeat - 1):
        _time_again(cell, program, stock_program, args, kwargs, backend, target_ if stock is not None else None, model)
    return cell


def _quantize_both(
    cell: Cell, module: Any, ep: Any, args: tuple, kwargs: dict, eager: list, *, compare_stock: bool, warm: bool,
) -> tuple[Any, Any, list, bool]:
    """The quantized cell's two programs: stock's quantized as executorch alone does, edgeplug's by
    ``edgeplug.quantize``. Returns (edgeplug's program or None, stock's, stock's eager outputs, whether
    stock goes on); a side that fails records where."""
    name, _, owner = cell.scheme.partition("@")  # SCHEME@OWNER: OWNER's scheme, lowered for this backend
    owner = owner or cell.backend
    record = next(r for r in get_backend(owner).records(QuantScheme) if r.scheme == name)
    if warm:
        warm_up(cell.backend)
    stock_program, stock_eager = ep, eager
    if compare_stock:
        try:
            stock_program = quantize_stock(module, args, kwargs, record)
            with torch.no_grad():
                stock_eager = _flat(stock_program.module()(*args, **kwargs))
        except StageError as exc:
            cell.stock = Side(error=str(exc), stage=exc.stage)
            compare_stock = False
    try:  # a source transform rewrites the module's linear layers: it takes the module, not the program
        source = module if record.kind == "source_transform" else ep
        program = quantize(source, args, owner, name, kwargs=kwargs or None)
    except Exception as exc:
        cell.edgeplug = Side(error=cell_error(exc), stage="quantize")
        program = None
    return program, stock_program, stock_eager, compare_stock


def _lower_both(
    cell: Cell, program: Any, stock_program: Any, stock_eager: list, eager: list, args: tuple, kwargs: dict,
    stock: Optional[CellTarget],
) -> dict[str, bytes]:
    """Stock's lowering (where ``stock``), then edgeplug's; the serialized programs by side."""
    buffers: dict[str, bytes] = {}
    if stock is not None:
        keep: dict = {}
        cell.stock = lower_stock(
            stock_program, args, [] if kwargs else stock_eager, stock, keep,
            float_outputs=eager if cell.scheme != FLOAT else None,
        )
        if "buffer" in keep:
            buffers["stock"] = keep["buffer"]
    result = None
    if program is not None:
        cell.edgeplug, result = lower_edgeplug(program, args, cell.backend, cell.dry_run, label(cell.model), kwargs=kwargs)
    if result is not None:
        fusions = result.report.fusions
        cell.fusion_outcomes = dict(Counter(str(f.outcome) for f in fusions))
        cell.rejected = [(f.anchor, f.reason) for f in fusions if str(f.outcome) == "rejected"]
        if result.program is not None:
            buffers["edgeplug"] = result.buffer
    # the repeats run with the same live objects as the first stock lowering: not the first
    # lowering's programs, which would make every later lowering's garbage collection slower
    del result
    return buffers


def _run_ptes(cell: Cell, buffers: dict[str, bytes], args: tuple, eager: list) -> None:
    """A quantized cell whose programs run here: edgeplug's .pte against the float model, measured as
    stock's is, then both .pte files timed."""
    if "edgeplug" in buffers:
        try:  # the .pte itself against the float model, measured as stock's is
            # executorch's runtime (a native library): loaded in the cells that run a .pte, not at import

            outs = _flat(_executorch.load_pte(buffers["edgeplug"]).forward(list(args)))
            cell.edgeplug.cosine_to_float, cell.edgeplug.max_abs_float = versus_float(outs[0], eager[0])
        except Exception as exc:
            cell.edgeplug.verify_error = cell.edgeplug.verify_error or cell_error(exc)
    if buffers:
        try:
            for side, ms in time_ptes(buffers, list(args)).items():
                getattr(cell, side).latency_ms = ms
        except Exception as exc:
            cell.detail = "timing the .pte files: " + cell_error(exc)


def _time_again(
    cell: Cell, program: Any, ep: Any, args: tuple, kwargs: dict, backend: str, target_: Optional[CellTarget], model: str
) -> None:
    """One more lowering of each side that lowered, timed only; each side keeps its fastest time."""
    if target_ is not None and cell.stock.ok:
        again = lower_stock(ep, args, [], target_)
        if again.ok:
            cell.stock.seconds = min(cell.stock.seconds, again.seconds)
    if cell.edgeplug.ok:
        again, _ = lower_edgeplug(program, args, backend, cell.dry_run, label(model), verify=False, kwargs=kwargs)
        if again.ok:
            cell.edgeplug.seconds = min(cell.edgeplug.seconds, again.seconds)
