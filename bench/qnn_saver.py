"""QNN through Qualcomm's saver backend: edgeplug's qnn plugin against ExecuTorch's own QNN flow.

Both sides lower the same model in the same process, and every partition of
both goes through ExecuTorch's ``QnnBackend`` preprocess and op builders
against the real QNN interface, recorded by QNN's saver backend
(``edgeplug_qnn.saver``):

- **edgeplug**: ``edgeplug.lower(model, inputs, "qnn")`` with
  ``EDGEPLUG_QNN_SAVER=1``;
- **stock**: ``to_edge_transform_and_lower_to_qnn(model, inputs, specs)``,
  what ExecuTorch's Qualcomm examples run, with the same saver compile specs.

Per model and side: partitions, nodes left on the CPU, the norms present in
the exported program (``aten.rsqrt`` / ``aten.rms_norm`` nodes), the norms
delegated as ``aten.rms_norm``, the ``RmsNorm`` nodes QNN's saver recorded,
and the QNN graph nodes recorded in all.

Needs the QNN libraries laid out as ``.ci/qnn_saver.sh`` does it
(``QNN_SDK_ROOT``, ``LD_LIBRARY_PATH``)::

    python bench/qnn_saver.py [--models llama,gemma3,qwen3] [--layers 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

HERE = Path(__file__).resolve().parent
#: the built-in example, then tiny transformers decoders from edgeplug._zoo
MODELS = ("llama", "gemma3", "qwen3")


def zoo() -> Any:
    """What this bench takes from the zoo: its tiny transformers decoders, how it counts a program's
    norms and stock's graph breaks, and its quiet logging (the zoo's cell module, not public API)."""
    from types import SimpleNamespace

    import edgeplug._zoo
    from edgeplug._failures import first_line
    from edgeplug._zoo._cell import _quiet
    from edgeplug._zoo._lowering import stock_graph_breaks

    return SimpleNamespace(
        build=edgeplug._zoo.build, count_norms=edgeplug._zoo.count_norms, stock_graph_breaks=stock_graph_breaks,
        first_line=first_line, _quiet=_quiet,
    )


def build(name: str, layers: Optional[int] = None) -> tuple[torch.nn.Module, tuple]:
    """``llama``: edgeplug's built-in example; any other name: the zoo's tiny transformers model."""
    if name == "llama":
        from edgeplug.examples.llama import tiny_llama

        return tiny_llama()
    return zoo().build(name, layers)


@dataclass
class Side:
    ok: bool = False
    error: str = ""
    partitions: int = 0
    cpu_nodes: int = 0
    cpu_ops: dict = field(default_factory=dict)
    #: aten.rms_norm nodes inside QNN partitions
    rms_norm_delegated: int = 0
    #: RmsNorm nodes QNN's saver recorded (QNN's RmsNorm op builder accepted each)
    rms_norm_recorded: int = 0
    #: QNN graph nodes recorded, all partitions
    qnn_nodes: int = 0
    #: partitions whose QNN graph the saver recorded as finalized
    finalized: int = 0
    seconds: float = 0.0


@dataclass
class Comparison:
    model: str
    norms: int
    edgeplug: Side
    stock: Side


def _delegated_rms_norms(edge_ep: Any) -> int:
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    return sum(
        1
        for _name, lowered, _node in get_lowered_submodules(edge_ep.graph_module)
        for n in lowered.original_module.graph.nodes
        if n.op == "call_function" and "rms_norm" in str(n.target)
    )


def _fill(side: Side, edge_ep: Any, records: list) -> None:
    """Partitions and CPU nodes as the zoo counts stock's (as edgeplug's report counts them)."""
    side.partitions, cpu = zoo().stock_graph_breaks(edge_ep)
    side.cpu_ops = dict(cpu)
    side.cpu_nodes = sum(cpu.values())
    side.rms_norm_delegated = _delegated_rms_norms(edge_ep)
    _fill_records(side, records)


def _fill_records(side: Side, records: list) -> None:
    side.rms_norm_recorded = sum(r.ops.get("RmsNorm", 0) for r in records)
    side.qnn_nodes = sum(r.nodes for r in records)
    side.finalized = sum(1 for r in records if r.finalized)
    side.ok = len(records) == side.partitions


@contextlib.contextmanager
def saver_mode() -> Iterator[None]:
    """``EDGEPLUG_QNN_SAVER=1`` while open (as it was before, after)."""
    from edgeplug_qnn import saver

    before = os.environ.get(saver.MODE_VAR)
    os.environ[saver.MODE_VAR] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(saver.MODE_VAR, None)
        else:
            os.environ[saver.MODE_VAR] = before


def lower_edgeplug(model: torch.nn.Module, inputs: tuple, name: str) -> tuple[Side, Any]:
    import edgeplug
    from edgeplug_qnn import saver

    side = Side()
    t = time.perf_counter()
    try:
        with saver_mode():
            result = edgeplug.lower(model, inputs, "qnn", model_name=name)
    except Exception as exc:
        side.error = why(exc)
        return side, None
    side.seconds = time.perf_counter() - t
    report = result.report  # the program itself was serialized since (to_executorch rewrites it)
    records = saver.lowered_records(result.edge.exported_program())
    side.partitions = len(report.partitions)
    side.cpu_ops = dict(report.cpu_ops)
    side.cpu_nodes = len(report.cpu_nodes)
    side.rms_norm_delegated = report.delegated_ops.get("aten.rms_norm.default", 0)
    _fill_records(side, records)
    return side, result


def why(exc: BaseException) -> str:
    """The innermost cause's first line, then the outer error's (executorch wraps a pass's error)."""
    root = exc
    while root.__cause__ is not None or (root.__context__ is not None and not root.__suppress_context__):
        root = root.__cause__ or root.__context__
    inner = zoo().first_line(root)
    return inner if root is exc else f"{inner} (in: {zoo().first_line(exc)[:120]})"


def lower_stock(model: torch.nn.Module, inputs: tuple) -> Side:
    from executorch.backends.qualcomm.utils.utils import to_edge_transform_and_lower_to_qnn

    from edgeplug_qnn import saver, support

    side = Side()
    specs = saver.compile_specs(support.soc())
    t = time.perf_counter()
    try:
        with saver.per_partition_saver(specs) as records:
            edge = to_edge_transform_and_lower_to_qnn(copy.deepcopy(model), inputs, specs)
    except Exception as exc:
        side.error = why(exc)
        return side
    side.seconds = time.perf_counter() - t
    _fill(side, edge.exported_program(), records)
    return side


def lower_stock_apart(name: str, layers: Optional[int] = None) -> Side:
    """``lower_stock`` in a child process (its own saver folder): ExecuTorch's QNN flow can crash the
    process (seen: a segmentation fault in its LayoutTransform pass on gemma3, after its own RMSNorm
    fusion made an ``aten.rms_norm`` with ``normalized_shape=[]``)."""
    import subprocess
    import tempfile

    from edgeplug_qnn import saver

    with tempfile.TemporaryDirectory(prefix="edgeplug-qnn-stock-") as tmp:
        out = Path(tmp) / "stock.json"
        env = {**os.environ, saver.DIR_VAR: tmp}
        argv = [sys.executable, str(Path(__file__).resolve()), "--stock-only", name, "--json", str(out)]
        if layers is not None:
            argv += ["--layers", str(layers)]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True)
        if not out.is_file():
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            return Side(error=f"the stock lowering's process ended with status {proc.returncode}: {tail}"[:300])
        return Side(**json.loads(out.read_text()))


def compare(name: str, layers: Optional[int] = None) -> Comparison:
    """Lower ``name`` with edgeplug here and with stock ExecuTorch in a child process; nothing raises
    (a side that fails says why)."""
    model, inputs = build(name, layers)
    with torch.no_grad():
        norms = zoo().count_norms(torch.export.export(copy.deepcopy(model), inputs))
    ours, _ = lower_edgeplug(model, inputs, name)
    stock = lower_stock_apart(name, layers)
    return Comparison(model=name, norms=norms, edgeplug=ours, stock=stock)


def table(rows: list[Comparison]) -> str:
    head = (
        "| model | side | partitions | CPU nodes | norms present | rms_norm delegated | RmsNorm recorded by QNN "
        "| QNN nodes recorded | time |\n|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for c in rows:
        for label, s in (("edgeplug", c.edgeplug), ("stock", c.stock)):
            if s.error:
                lines.append(f"| {c.model} | {label} | failed: {s.error} | | | | | | |")
                continue
            cpu = f"{s.cpu_nodes}" + (f" ({', '.join(f'{op} {n}' for op, n in sorted(s.cpu_ops.items()))})" if s.cpu_ops else "")
            lines.append(
                f"| {c.model} | {label} | {s.partitions} | {cpu} | {c.norms} | {s.rms_norm_delegated} | "
                f"{s.rms_norm_recorded} | {s.qnn_nodes} | {s.seconds:.1f} s |"
            )
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--layers", type=int, default=None, help="decoder layers of the zoo models (default: the zoo's 2)")
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    parser.add_argument("--stock-only", default=None, help=argparse.SUPPRESS)  # lower_stock_apart's child
    args = parser.parse_args(argv)

    from edgeplug_qnn import saver

    with saver_mode():
        available = saver.availability()
    if not available.ok:
        print(f"QNN's saver cannot run here: {available.reason}. {available.hint}", file=sys.stderr)
        return 2
    zoo()._quiet()
    if args.stock_only:
        model, inputs = build(args.stock_only, args.layers)
        Path(args.json).write_text(json.dumps(asdict(lower_stock(model, inputs))))
        return 0
    rows = [compare(m, args.layers) for m in args.models.split(",")]
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0 if all(r.edgeplug.ok for r in rows) else 1  # a stock failure is a finding, not ours


if __name__ == "__main__":
    sys.exit(main())
