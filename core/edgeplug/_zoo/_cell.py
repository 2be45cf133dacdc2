"""One zoo cell: a model lowered for a backend under a scheme, with edgeplug and (on request) stock executorch.

``run_cell`` is what runs inside a cell's own process, under either executor.
Per cell: partitions, nodes left on the CPU by op (with the partitioner's
reasons), norms fused out of the norms present, max |lowered - eager| where the
backend's program runs on this host, and lowering times (serialization
included, verification not). A cell that fails carries the first line of its
error; it never raises.
"""

from __future__ import annotations

import copy
import gc
import logging
import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from typing import Any, Callable, Optional

import torch

from edgeplug._zoo._models import MODELS, exported_call, label

FLOAT = "float"

#: what a cell's process ended as: ``ran`` (the cell's own figures say how lowering went), or why it has none
STATUSES = ("ran", "timeout", "memory", "crashed", "lost")


@dataclass(frozen=True)
class Target:
    """How a backend's cell runs: a real lowering against stock, or a dry run."""

    dry_run: bool
    stock: Optional[Callable[[], Any]]  # executorch's own partitioner, or None
    stock_absent: str = ""  # why there is no stock column
    #: the stock .pte runs in executorch's Python runtime (the backend's own programs do: verify_method "pte")
    stock_runs_here: bool = False


def target(backend: str) -> Target:
    """How ``backend``'s cells run, from what its plugin declares (the core names no backend).

    A real lowering where its delegate serializes here, else a dry run. The stock flow is
    executorch's ``to_edge_transform_and_lower`` with the partitioner the plugin builds, used alone,
    where that partitioner is executorch's own class (a support-table stand-in is not a stock flow).
    """
    import edgeplug

    b = edgeplug.get_backend(backend)
    available = b.availability()
    if not available.ok:
        return Target(True, None, f"its SDK is absent here ({available.reason}): stock cannot run here")
    inner = type(b.make_partitioner())
    if not inner.__module__.startswith("executorch."):
        return Target(False, None, f"it partitions with {inner.__name__}, not an executorch partitioner: no stock flow")
    return Target(False, b.make_partitioner, stock_runs_here=b.spec.verify_method == "pte")


def op_label(target: Any) -> str:
    """'aten.mean.dim' for an edge or aten op (the report's spelling)."""
    op = target if isinstance(target, torch._ops.OpOverload) else getattr(target, "_op", target)
    schema = getattr(op, "_schema", None)
    if schema is not None and hasattr(op, "_overloadname"):
        return f"{schema.name.replace('::', '.')}.{op._overloadname}"
    return getattr(op, "__name__", None) or str(op)


def stock_graph_breaks(edge_ep: Any) -> tuple[int, Counter]:
    """(partitions, CPU ops) of a program stock executorch lowered, counted as edgeplug's report counts."""
    import operator

    from executorch.exir.lowered_backend_module import get_lowered_submodules

    partitions = len(get_lowered_submodules(edge_ep.graph_module))
    cpu: Counter = Counter()
    for n in edge_ep.graph_module.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        if "executorch_call_delegate" in str(n.target):
            continue
        cpu[op_label(n.target)] += 1
    return partitions, cpu


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _flat(out: Any) -> list[torch.Tensor]:
    import torch.utils._pytree as pytree

    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]



@dataclass
class Side:
    """One lowering of a cell: edgeplug's or stock's."""

    ok: bool = False
    error: str = ""
    partitions: Optional[int] = None
    cpu_ops: dict = field(default_factory=dict)
    #: op -> sorted distinct reasons (edgeplug only)
    cpu_reasons: dict = field(default_factory=dict)
    seconds: Optional[float] = None
    max_abs_diff: Optional[float] = None
    verify_error: str = ""
    verify_method: str = ""
    verify_seconds: Optional[float] = None
    #: the report's own verdict (its tolerance for the dtype), with why it failed
    verify_passed: Optional[bool] = None
    verify_problems: list = field(default_factory=list)
    #: where a failing side stopped (quantized cells: "export", "prepare_pt2e", "calibrate", "convert_pt2e",
    #: "quantize_", "quantize", "lower", "to_executorch", "run"); empty when it lowered
    stage: str = ""
    #: quantized cells: the program's logits against the float model's (cosine similarity, max |q - float|)
    cosine_to_float: Optional[float] = None
    max_abs_float: Optional[float] = None
    #: size of the serialized program (real lowerings), and its median forward time in executorch's
    #: runtime on one thread (the backend's programs run here), the two sides alternating
    pte_bytes: Optional[int] = None
    latency_ms: Optional[float] = None

    @property
    def cpu_nodes(self) -> Optional[int]:
        return sum(self.cpu_ops.values()) if self.ok else None



@dataclass
class Cell:
    """One finished cell, as a JSON line holds it."""

    model: str
    backend: str
    scheme: str = FLOAT
    dry_run: bool = False
    #: how the cell's process ended (STATUSES); ``detail`` says more when it is not "ran"
    status: str = "ran"
    detail: str = ""
    #: process starts it took (a lost worker is retried)
    attempts: int = 1
    #: wall time of the cell's process and its peak resident memory (MiB)
    wall_seconds: Optional[float] = None
    peak_mb: Optional[float] = None
    norms_present: Optional[int] = None
    #: fusion outcome -> count (every outcome but "rejected" is a fusion)
    fusion_outcomes: dict = field(default_factory=dict)
    #: (anchor, reason) of each rejected fusion
    rejected: list = field(default_factory=list)
    edgeplug: Side = field(default_factory=Side)
    stock: Side = field(default_factory=Side)
    stock_absent: str = ""
    #: the backend has no rms_norm fusion policy (nothing to fuse into: xnnpack)
    no_policy: bool = False
    error: str = ""  # the model itself could not be built, exported or quantized

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.model, self.backend, self.scheme)

    @property
    def label(self) -> str:
        return label(self.model)

    @property
    def norms_fused(self) -> int:
        return sum(n for o, n in self.fusion_outcomes.items() if o != "rejected")

    @property
    def norms_recorded(self) -> int:
        return sum(self.fusion_outcomes.values())

    @property
    def time_ratio(self) -> Optional[float]:
        e, s = self.edgeplug.seconds, self.stock.seconds
        if self.edgeplug.ok and self.stock.ok and e and s:
            return e / s
        return None

    @property
    def size_ratio(self) -> Optional[float]:
        e, s = self.edgeplug.pte_bytes, self.stock.pte_bytes
        return e / s if self.edgeplug.ok and self.stock.ok and e and s else None

    @property
    def latency_ratio(self) -> Optional[float]:
        e, s = self.edgeplug.latency_ms, self.stock.latency_ms
        return e / s if self.edgeplug.ok and self.stock.ok and e and s else None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Cell":
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        d["edgeplug"] = Side(**d.get("edgeplug") or {})
        d["stock"] = Side(**d.get("stock") or {})
        d["rejected"] = [tuple(r) for r in d.get("rejected") or []]
        return cls(**d)


#: the fields that change from run to run of the same cell: results compare without them
TIMING_FIELDS = ("attempts", "wall_seconds", "peak_mb")
SIDE_TIMING_FIELDS = ("seconds", "verify_seconds", "latency_ms")


def comparable(cell: Cell) -> dict:
    """The cell as a dict without its timings: two runs of the same cell compare equal on this."""
    d = cell.to_dict()
    for name in TIMING_FIELDS:
        d.pop(name)
    for side in ("edgeplug", "stock"):
        for name in SIDE_TIMING_FIELDS:
            d[side].pop(name)
    return d


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


def lower_edgeplug(
    ep: Any, inputs: tuple, backend: str, dry_run: bool, model_name: str, verify: bool = True,
    kwargs: Optional[dict] = None,
) -> tuple[Side, Any]:
    """edgeplug.lower (timed, serialization included) then edgeplug.verify where it runs."""
    import edgeplug

    side = Side()
    try:
        gc.collect()  # each timed lowering starts from a collected heap, stock's and edgeplug's alike
        t = time.perf_counter()
        result = edgeplug.lower(
            copy.deepcopy(ep), inputs, backend, kwargs=kwargs or None, dry_run=dry_run, model_name=model_name
        )
        side.seconds = time.perf_counter() - t
    except Exception as exc:
        side.error, side.stage = first_line(exc), "lower"
        return side, None
    report = result.report
    side.ok = True
    if result.program is not None:
        side.pte_bytes = len(result.buffer)
    side.partitions = len(report.partitions)
    side.cpu_ops = dict(report.cpu_ops)
    reasons: dict[str, set] = {}
    for c in report.cpu_nodes:
        reasons.setdefault(c.op, set()).add(c.reason)
    side.cpu_reasons = {op: sorted(r) for op, r in reasons.items()}
    if verify and not dry_run:
        try:
            t = time.perf_counter()
            v = edgeplug.verify(result, backend)
            side.verify_seconds = time.perf_counter() - t
            side.max_abs_diff = v.max_abs_diff
            side.verify_method = v.method + (f" on {v.adapter}" if v.adapter else "")
            if hasattr(v, "passed"):
                side.verify_passed = bool(v.passed)
                side.verify_problems = list(v.failures()) if not v.passed else []
            q = result.report.quantization
            if q is not None and q.cosine_to_float:  # the lowered program against the float model
                side.cosine_to_float, side.max_abs_float = q.cosine_to_float[0], q.versus_float[0]
        except Exception as exc:
            side.verify_error = first_line(exc)
    return side, result


def lower_stock(
    ep: Any, inputs: tuple, eager: list, target: Target, keep: Optional[dict] = None,
    float_outputs: Optional[list] = None,
) -> Side:
    """executorch's to_edge_transform_and_lower with the backend's own partitioner, then to_executorch.

    ``eager``: the outputs the .pte should give (where it runs here); ``float_outputs``: the float model's,
    for a quantized program's cosine and max |Δ| to float; ``keep``: a dict that receives the serialized
    program as ``"buffer"`` (to time it later)."""
    from executorch.exir import to_edge_transform_and_lower

    side = Side()
    stage = "to_edge_transform_and_lower"
    try:
        gc.collect()
        t = time.perf_counter()
        edge = to_edge_transform_and_lower(copy.deepcopy(ep), partitioner=[target.stock()])
        paused = time.perf_counter()
        # counted before to_executorch, which rewrites the program in place (out variants, allocs)
        side.partitions, cpu = stock_graph_breaks(edge.exported_program())
        side.cpu_ops = dict(cpu)
        resumed = time.perf_counter()
        stage = "to_executorch"
        buffer = edge.to_executorch().buffer
        side.seconds = time.perf_counter() - t - (resumed - paused)
    except Exception as exc:
        side.error, side.stage = first_line(exc), stage
        return side
    side.ok = True
    side.pte_bytes = len(buffer)
    if keep is not None:
        keep["buffer"] = buffer
    if target.stock_runs_here:  # a delegate executorch's Python runtime runs (the backend verifies .pte files)
        try:
            from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

            if not eager:
                return side
            outs = _flat(_load_for_executorch_from_buffer(buffer).forward(tuple(inputs)))
            side.max_abs_diff = max(
                (a.double() - e.double()).abs().max().item() for a, e in zip(outs, eager)
            )
            side.verify_method = "pte"
            if float_outputs:
                side.cosine_to_float, side.max_abs_float = versus_float(outs[0], float_outputs[0])
        except Exception as exc:
            side.stage = "run"
            side.verify_error = first_line(exc)
    return side


def versus_float(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(cosine similarity, max |out - ref|) of a program's first output against the float model's."""
    a, b = out.detach().double().flatten(), ref.detach().double().flatten()
    return torch.nn.functional.cosine_similarity(a, b, dim=0).item(), (a - b).abs().max().item()


class StageError(Exception):
    """A stock quantization flow stopped at ``stage``: the first line of what it raised."""

    def __init__(self, stage: str, exc: BaseException) -> None:
        super().__init__(first_line(exc))
        self.stage = stage


def quantize_stock(module: torch.nn.Module, args: tuple, kwargs: dict, record: Any) -> Any:
    """What a user of executorch alone runs for the quantizer of ``record`` (a QuantScheme): the program to lower.

    ``pt2e``: ``torch.export``, ``prepare_pt2e`` with the same quantizer, one calibration call on the example
    inputs, ``convert_pt2e``, export again. ``source_transform``: torchao's ``quantize_`` with the same
    config(s) on a copy, then ``torch.export``. Nothing is folded or rewritten first. Raises StageError."""
    stage = "export"
    try:
        if record.kind == "pt2e":
            from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

            with torch.no_grad():
                ep = torch.export.export(module, args, kwargs or None)
                stage = "prepare_pt2e"
                prepared = prepare_pt2e(ep.module(), record.factory())
                stage = "calibrate"
                prepared(*args, **kwargs)
                stage = "convert_pt2e"
                converted = convert_pt2e(prepared)
                stage = "export"
                return torch.export.export(converted, args, kwargs or None)
        from torchao.quantization import quantize_

        stage = "quantize_"
        made = record.factory()
        steps = list(made) if isinstance(made, (list, tuple)) else [(made, None)]
        copied = copy.deepcopy(module)
        with torch.no_grad():
            for config, keep in steps:
                quantize_(copied, config, filter_fn=keep)
            stage = "export"
            return torch.export.export(copied, args, kwargs or None)
    except Exception as exc:
        raise StageError(stage, exc) from exc


def time_ptes(buffers: dict[str, bytes], inputs: list, rounds: int = 15, calls: int = 20) -> dict[str, float]:
    """Median forward time (ms) of each serialized program in executorch's runtime, on one thread.

    Every round times ``calls`` forwards of each program, the sides alternating (the first side changes
    from round to round), after three warm-up calls each; the median over rounds is kept."""
    from executorch.extension.pybindings import portable_lib

    portable_lib._unsafe_reset_threadpool(1)  # one thread: the figure is the program's, not the machine's
    modules = {name: portable_lib._load_for_executorch_from_buffer(b) for name, b in buffers.items()}
    for m in modules.values():
        for _ in range(3):
            m.forward(list(inputs))
    times: dict[str, list[float]] = {name: [] for name in modules}
    order = list(modules)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            m = modules[name]
            t = time.perf_counter()
            for _ in range(calls):
                m.forward(list(inputs))
            times[name].append((time.perf_counter() - t) * 1000 / calls)
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}



def schemes_of(backend: str) -> list[str]:
    """The quantization schemes ``backend`` declares (its plugins' QuantScheme records)."""
    import edgeplug
    from edgeplug._records import QuantScheme

    return [c.record.scheme for c in edgeplug.get_backend(backend).contributions if isinstance(c.record, QuantScheme)]


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
    target_ = target(backend)
    cell = Cell(model=model, backend=backend, scheme=scheme, dry_run=target_.dry_run, stock_absent=target_.stock_absent)
    if not compare_stock:
        cell.stock_absent = "not compared (--compare-stock)"
    stock = target_.stock if compare_stock else None
    try:
        module, ep, args, kwargs, cell.norms_present = exported_call(model, layers)
        with torch.no_grad():
            eager = _flat(module(*args, **kwargs))
    except Exception as exc:
        cell.error = "build/export: " + first_line(exc)
        return cell
    import edgeplug

    try:
        cell.no_policy = edgeplug.get_backend(backend).fusion_policy("rms_norm") is None
    except Exception:
        pass
    program = ep
    stock_program, stock_eager = ep, eager
    if scheme != FLOAT:
        name, _, owner = scheme.partition("@")  # SCHEME@OWNER: OWNER's scheme, lowered for this backend
        owner = owner or backend
        record = next(r for r in edgeplug.get_backend(owner).records(edgeplug.QuantScheme) if r.scheme == name)
        if warm:
            warm_up(backend)
        if stock is not None:
            try:
                stock_program = quantize_stock(module, args, kwargs, record)
                with torch.no_grad():
                    stock_eager = _flat(stock_program.module()(*args, **kwargs))
            except StageError as exc:
                cell.stock = Side(error=str(exc), stage=exc.stage)
                stock = None
        try:  # a source transform rewrites the module's linear layers: it takes the module, not the program
            source = module if record.kind == "source_transform" else ep
            program = edgeplug.quantize(source, args, owner, name, kwargs=kwargs or None)
        except Exception as exc:
            cell.edgeplug = Side(error=first_line(exc), stage="quantize")
            program = None
    elif warm:
        warm_up(backend)
    buffers: dict[str, bytes] = {}
    if stock is not None:
        keep: dict = {}
        cell.stock = lower_stock(
            stock_program, args, [] if kwargs else stock_eager, target_, keep,
            float_outputs=eager if scheme != FLOAT else None,
        )
        if "buffer" in keep:
            buffers["stock"] = keep["buffer"]
    result = None
    if program is not None:
        cell.edgeplug, result = lower_edgeplug(program, args, backend, target_.dry_run, label(model), kwargs=kwargs)
    if result is not None:
        fusions = result.report.fusions
        cell.fusion_outcomes = dict(Counter(str(f.outcome) for f in fusions))
        cell.rejected = [(f.anchor, f.reason) for f in fusions if str(f.outcome) == "rejected"]
        if result.program is not None:
            buffers["edgeplug"] = result.buffer
    # the repeats run with the same live objects as the first stock lowering: not the first
    # lowering's programs, which would make every later lowering's garbage collection slower
    del result
    runs_here = edgeplug.get_backend(backend).spec.verify_method == "pte"
    if scheme != FLOAT and runs_here and "edgeplug" in buffers and not kwargs:
        try:  # the .pte itself against the float model, measured as stock's is
            from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

            outs = _flat(_load_for_executorch_from_buffer(buffers["edgeplug"]).forward(list(args)))
            cell.edgeplug.cosine_to_float, cell.edgeplug.max_abs_float = versus_float(outs[0], eager[0])
        except Exception as exc:
            cell.edgeplug.verify_error = cell.edgeplug.verify_error or first_line(exc)
    if scheme != FLOAT and runs_here and buffers and not kwargs:
        try:
            for side, ms in time_ptes(buffers, list(args)).items():
                getattr(cell, side).latency_ms = ms
        except Exception as exc:
            cell.detail = "timing the .pte files: " + first_line(exc)
    for _ in range(repeat - 1):
        _time_again(cell, program, stock_program, args, kwargs, backend, target_ if stock is not None else None, model)
    return cell


def _time_again(
    cell: Cell, program: Any, ep: Any, args: tuple, kwargs: dict, backend: str, target_: Optional[Target], model: str
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
