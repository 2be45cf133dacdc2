"""The lowering report as one self-contained HTML page, and the stock flow's partitioning beside it.

``render_html(report)`` returns a page with no external reference: the report
as JSON, the page's script and style, and the graph layout library (dagre,
vendored under ``edgeplug/_vendor`` with its MIT license) all inline. The page
draws ``report.graph`` top to bottom, each node coloured by its partition or
marked as left on the CPU, with the CPU nodes, fusions and transforms as
sortable tables linked to it; layers collapse by module path. With
``report.stock`` (``stock_partitioning``) it shows the backend's stock
executorch partitioning of the same model and counts the differences.
"""

from __future__ import annotations

import copy
import html
import json
import operator
import os
from collections import Counter
from importlib import resources
from typing import Any, Sequence

from pydantic import ValidationError

from edgeplug import __version__
from edgeplug._errors import EdgeplugError
from edgeplug._failures import first_line
from edgeplug._outputs import write_file
from edgeplug._report.records import (
    REPORT_FORMAT, CpuNode, LoweringReport, PartitionSummary, StockPartitioning, annotate_graph, graph_of,
    lowered_partitions,
)
from edgeplug._shape_env import kept_shape_envs

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{title}</title>
<style>{css}</style>
</head><body>
<header><h1 id="title"></h1><div id="subtitle" class="muted"></div></header>
<main>
<h2>Summary</h2><div id="cards" class="cards"></div>
<section id="compare-section" hidden><h2>Against stock executorch</h2>
<p class="muted">stock: <span id="flow-stock"></span></p>
<table id="compare"></table><h3>ops placed differently</h3><table id="compare-ops"></table></section>
<h2>Graph</h2>
<div class="toolbar">
<input id="search" type="search" placeholder="search nodes by name or op" size="32">
<button id="collapse">collapse layers</button><button id="expand">expand all</button><button id="fit">fit</button>
<label><input id="weights" type="checkbox"> show weights</label>
<span id="views"><label><input type="radio" name="view" id="view-edgeplug" value="edgeplug" checked> edgeplug</label>
<label><input type="radio" name="view" id="view-stock" value="stock"> stock executorch</label></span>
</div>
<div id="matches"></div>
<div id="legend" class="legend"></div>
<div id="graph-wrap"><div id="graph"><svg id="svg"><g id="viewport"></g></svg></div>
<div id="detail"><p class="muted">Click a node (or hover) for its op, shapes, dtypes, partition or CPU reason,
and the fusion or transform that made it. Click a collapsed group to expand it.</p></div></div>
<div id="graph-status" class="muted"></div>
<h2>Left on the CPU</h2><table id="cpu-nodes"></table>
<h2>Partitions</h2><table id="partitions"></table>
<h2>Fusions</h2><table id="fusions"></table>
<h2>Transforms</h2><table id="transforms"></table>
<h2>Stage timings</h2><table id="stages"></table>
<ul id="notes"></ul>
</main>
<script type="application/json" id="edgeplug-report">{data}</script>
<script>{dagre}</script>
<script>{js}</script>
</body></html>
"""


def _asset(folder: str, name: str) -> str:
    return resources.files("edgeplug").joinpath(folder, name).read_text(encoding="utf-8")


def _inline_json(text: str) -> str:
    # Inside <script>, "</script" would close the element and "<!--" change how the rest is parsed.
    # "<", ">" and "&" occur in JSON only inside strings, where the \u escapes below read back as the
    # same characters. (A "\!" would not do: JSON has no such escape and JSON.parse refuses the page's data.)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_html(report: LoweringReport) -> str:
    """The report as one HTML page with every script, style and datum inline (no network)."""
    return _PAGE.format(
        title=html.escape(f"edgeplug: {report.model} -> {report.backend}"),
        css=_asset("_report/page", "report.css"),
        data=_inline_json(report.to_json(indent=None)),
        dagre=_asset("_vendor", "dagre.min.js"),
        js=_asset("_report/page", "report.js"),
    )


def write_report(path: str | os.PathLike, report: LoweringReport) -> None:
    """Write ``report`` to ``path`` atomically: HTML for a ``.html``/``.htm`` path, JSON otherwise."""
    write_file(path, render_html(report) if is_html(path) else report.to_json())


def is_html(path: str | os.PathLike | None) -> bool:
    return path is not None and os.fspath(path).lower().endswith((".html", ".htm"))


def load_report(path: str | os.PathLike) -> LoweringReport:
    """A report ``--report X.json`` wrote, read back (its ``summary`` is derived, so it is dropped).

    What is not such a report (not JSON, JSON of another shape, a report of a newer format than
    this edgeplug reads) is refused with one line naming the file and what to give instead.
    """
    name = os.fspath(path)
    give = "give the file `edgeplug lower --report X.json` wrote"
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise EdgeplugError(f"cannot read the report {name}: {exc.strerror or exc}") from exc
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, or nested past what the parser takes
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise EdgeplugError(f"{name} is not JSON ({why}): {give}") from exc
    if not isinstance(data, dict):
        raise EdgeplugError(f"{name} holds JSON ({type(data).__name__}) but not a lowering report: {give}")
    version = data.get("format_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise EdgeplugError(f"{name} is not a lowering report edgeplug can read (format_version {version!r}): {give}")
    if version > REPORT_FORMAT:
        raise EdgeplugError(
            f"{name} is a report of format {version}, newer than this edgeplug ({__version__}) reads (format "
            f"{REPORT_FORMAT}): upgrade edgeplug to read it, or lower the model again with this one"
        )
    data.pop("summary", None)
    try:
        return LoweringReport.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        where = ".".join(str(p) for p in first["loc"]) or "the report"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise EdgeplugError(
            f"{name} is not a lowering report edgeplug can read ({where}: {first['msg']}{more}): {give}"
        ) from exc


# -- the stock flow -----------------------------------------------------------------------------


def stock_partitioning(model_or_ep: Any, example_inputs: Sequence[Any], backend: Any) -> StockPartitioning:
    """Lower the model with the backend's own executorch partitioner alone (executorch's
    ``to_edge_transform_and_lower``, as a user of executorch would) and describe its partitioning.

    A backend whose partitioner is not executorch's has no stock flow; a stock flow
    that fails is described, not raised: ``StockPartitioning.error`` says which.
    """
    # the plugin manager (pluggy): only for a stock comparison, which a report read back never needs
    from edgeplug._backend import Backend
    from edgeplug._registry.lookup import get_backend

    b = backend if isinstance(backend, Backend) else get_backend(backend)
    inner = b.make_partitioner()
    cls = f"{type(inner).__module__}.{type(inner).__qualname__}"
    flow = f"executorch.exir.to_edge_transform_and_lower(ep, partitioner=[{type(inner).__name__}()])"
    if not type(inner).__module__.startswith("executorch."):
        return StockPartitioning(
            flow=flow, error=f"backend {b.name!r} partitions with {cls}, not an executorch partitioner: there is no stock flow to compare with"
        )
    try:
        edge_ep, seen = _stock_lowering(model_or_ep, example_inputs, inner)
    except Exception as exc:
        return StockPartitioning(flow=flow, error=f"the stock flow failed: {first_line(exc)}")
    return _stock_record(flow, edge_ep, seen, f"not delegated by {type(inner).__name__} (the stock flow records no reason)")


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


def _stock_record(flow: str, edge_ep: Any, seen: list, why: str) -> StockPartitioning:
    """The stock flow's partitioning of ``edge_ep``: its partitions, and each node left on the CPU (``why``)."""
    # torch and executorch: as in _stock_lowering
    from edgeplug._lowered import count_delegated
    from edgeplug._partition import op_name

    parts, delegated = count_delegated(edge_ep)
    gm = edge_ep.graph_module
    cpu_nodes = [
        CpuNode(node=n.name, op=op_name(n.target), reason=why) for n in gm.graph.nodes
        if n.op == "call_function" and n.target is not operator.getitem and "executorch_call_delegate" not in str(n.target)
    ]
    return StockPartitioning(
        flow=flow, partitions=[PartitionSummary(**p.model_dump()) for p in parts], delegated_ops=dict(delegated),
        cpu_ops=dict(Counter(c.op for c in cpu_nodes)), cpu_nodes=cpu_nodes,
        graph=annotate_graph(seen, lowered_partitions(gm), {c.node: c.reason for c in cpu_nodes}),
    )
