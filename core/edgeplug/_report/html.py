"""The lowering report as one self-contained HTML page.

``render_html(report)`` returns a page with no external reference: the report
as JSON, the page's script and style, and the graph layout library (dagre,
vendored under ``edgeplug/_vendor`` with its MIT license) all inline. The page
draws ``report.graph`` top to bottom, each node coloured by its partition or
marked as left on the CPU, with the CPU nodes, fusions and transforms as
sortable tables linked to it; layers collapse by module path. With
``report.stock`` (``edgeplug._stock.stock_partitioning``) it shows the backend's stock
executorch partitioning of the same model and counts the differences.
"""

from __future__ import annotations

import html
import json
import os
from importlib import resources
from typing import Any, Optional

from pydantic import ValidationError

from edgeplug import __version__
from edgeplug._errors import EdgeplugError
from edgeplug._outputs import write_file
from edgeplug._report.records import REPORT_FORMAT, LoweringReport

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
    # one part per joinpath: Python 3.10's Traversable takes one (edgeplug supports 3.10)
    return resources.files("edgeplug").joinpath(folder).joinpath(name).read_text(encoding="utf-8")


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


#: the largest report ``load_report`` reads: far above what a lowering writes (a 32-layer decoder's is a few MiB)
MAX_REPORT_BYTES = 64 << 20


class _NonFinite(str):
    """What the JSON parser made of ``NaN``, ``Infinity`` or ``-Infinity`` (Python's json takes them; strict JSON
    does not): kept as its text, so the field holding it can be named."""


def _first_non_finite(value: Any, path: str = "") -> Optional[tuple[str, str]]:
    """``(field, text)`` of the first ``NaN``/``Infinity`` in parsed JSON (``partitions[0].nodes``), or None."""
    if isinstance(value, _NonFinite):
        return path, str(value)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _first_non_finite(item, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def load_report(path: str | os.PathLike) -> LoweringReport:
    """A report ``--report X.json`` wrote, read back (its ``summary`` is derived, so it is dropped).

    What is not such a report (not JSON, JSON of another shape, a report of a newer format than
    this edgeplug reads) is refused with one line naming the file and what to give instead.
    """
    name = os.fspath(path)
    give = "give the file `edgeplug lower --report X.json` wrote"
    try:
        with open(path, "rb") as f:  # at most one byte past the cap: a device or FIFO without end stops there
            raw = f.read(MAX_REPORT_BYTES + 1)
    except OSError as exc:
        raise EdgeplugError(f"cannot read the report {name}: {exc.strerror or exc}") from exc
    if len(raw) > MAX_REPORT_BYTES:
        raise EdgeplugError(
            f"{name} holds more than {MAX_REPORT_BYTES >> 20} MiB, more than any report edgeplug writes; it was "
            f"not read further: {give}"
        )
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_NonFinite)
        where = _first_non_finite(data)
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, or nested past what the parser takes
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise EdgeplugError(f"{name} is not JSON ({why}): {give}") from exc
    if where is not None:  # strict JSON has no NaN or infinity; edgeplug writes null there
        field, value = where
        raise EdgeplugError(
            f"{name} holds {value} at {field or 'its top level'}, which is not JSON (edgeplug's reports are "
            f"strict JSON and write null there): the file was edited or written by something else; {give}"
        )
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
        field_at = ".".join(str(p) for p in first["loc"]) or "the report"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise EdgeplugError(
            f"{name} is not a lowering report edgeplug can read ({field_at}: {first['msg']}{more}): {give}"
        ) from exc
