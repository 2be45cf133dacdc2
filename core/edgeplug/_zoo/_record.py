"""What a zoo cell records: ``Cell`` (one JSON line of the results file) and its two ``Side``s.

Plain data: ``run_cell`` (``_cell``) fills them, the executors (``_run``,
``_isolate``) carry them between processes as dicts, and ``_render`` turns
them into tables.
"""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, field, fields
from typing import Optional

from edgeplug._report.records import Partitioning
from edgeplug._zoo._models import label

FLOAT = "float"

#: what a cell's process ended as: ``ran`` (the cell's own figures say how lowering went), or why it has none
STATUSES = ("ran", "timeout", "memory", "crashed", "lost")


@dataclass
class Side:
    """One lowering of a cell: edgeplug's or stock's.

    Its partitioning is the one record ``Partitioning`` (``edgeplug._report.records``: a ``LoweringReport``
    and a ``StockPartitioning`` are one), kept as a results line holds it (a count of partitions, the CPU
    ops, why each stayed): ``partitioned`` fills these fields from the record."""

    ok: bool = False
    error: str = ""
    #: how many partitions (``len(Partitioning.partitions)``)
    partitions: Optional[int] = None
    #: ``Partitioning.cpu_ops``: op -> nodes of it left on the CPU
    cpu_ops: dict = field(default_factory=dict)
    #: op -> sorted distinct reasons of ``Partitioning.cpu_nodes`` (edgeplug only: stock's flow records none)
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
    #: edgeplug's side: the quantized model's own eager logits against the float model's (what the scheme costs)
    quantized_cosine: Optional[float] = None
    #: size of the serialized program (real lowerings), and its median forward time in executorch's
    #: runtime on one thread (the backend's programs run here), the two sides alternating
    pte_bytes: Optional[int] = None
    latency_ms: Optional[float] = None

    def partitioned(self, partitioning: Partitioning, *, reasons: bool = True) -> None:
        """This side's partition fields from a lowering's record (``reasons``: keep why each op stayed on the CPU)."""
        self.partitions = len(partitioning.partitions)
        self.cpu_ops = dict(partitioning.cpu_ops)
        by_op: dict[str, set] = {}
        for node in partitioning.cpu_nodes if reasons else ():
            by_op.setdefault(node.op, set()).add(node.reason)
        self.cpu_reasons = {op: sorted(why) for op, why in by_op.items()}

    @property
    def cpu_nodes(self) -> Optional[int]:
        """Nodes left on the CPU, as the record counts them (``Partitioning.cpu_node_count``); None where it failed."""
        return Partitioning(cpu_ops=self.cpu_ops).cpu_node_count if self.ok else None


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


def cell_from_json(data: object) -> Cell:
    """The ``Cell`` a parsed results line holds; ``ValueError`` saying what is wrong with a line of another shape.

    Fields this version does not know are dropped (a newer zoo's); a known field must have its type, and
    ``model``, ``backend`` and ``scheme`` must be non-empty text, so a table can show every cell it reads."""
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {type(data).__name__}, not an object")
    for name in ("model", "backend"):
        if name not in data:
            raise ValueError(f"no {name!r}")
    _check_fields(Cell, data, "")
    for name in ("model", "backend", "scheme"):
        if name in data and not data[name]:
            raise ValueError(f"{name!r} is empty")
    if data.get("status", "ran") not in STATUSES:
        raise ValueError(f"'status' is {data['status']!r}, not one of {', '.join(STATUSES)}")
    if not all(isinstance(r, list) and len(r) == 2 for r in data.get("rejected") or []):
        raise ValueError("'rejected' holds something other than [anchor, reason] pairs")
    counts = [("fusion_outcomes", data.get("fusion_outcomes"))]
    counts += [(f"{side}.cpu_ops", (data.get(side) or {}).get("cpu_ops")) for side in ("edgeplug", "stock")]
    for name, value in counts:
        if value and not all(isinstance(n, int) and not isinstance(n, bool) for n in value.values()):
            raise ValueError(f"{name!r} holds something other than counts")
    return Cell.from_dict({**data, **{side: _known(Side, data.get(side) or {}) for side in ("edgeplug", "stock")}})


def _known(cls: type, data: dict) -> dict:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _check_fields(cls: type, data: dict, where: str) -> None:
    hints = typing.get_type_hints(cls)
    for name, value in data.items():
        if name not in hints:
            continue
        hint = hints[name]
        if hint is Side:
            if not isinstance(value, dict):
                raise ValueError(f"'{where}{name}' is a {type(value).__name__}, not an object")
            _check_fields(Side, value, f"{name}.")
        elif not _matches_hint(value, hint):
            raise ValueError(f"'{where}{name}' is {_clipped_repr(value)}, not {_hint_name(hint)}")


def _matches_hint(value: object, hint: object) -> bool:
    if typing.get_origin(hint) is typing.Union:
        return any(_matches_hint(value, arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    origin = typing.get_origin(hint) or hint
    return isinstance(value, origin) if isinstance(origin, type) else True


def _hint_name(hint: object) -> str:
    if typing.get_origin(hint) is typing.Union:
        return " or ".join(_hint_name(a) for a in typing.get_args(hint))
    return {type(None): "null", str: "text", int: "an integer", float: "a number", bool: "true/false",
            dict: "an object", list: "a list"}.get(hint, getattr(hint, "__name__", str(hint)))


def _clipped_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
