"""How long a 32-layer decoder's HTML report takes to open in Chromium.

Lowers ``edgeplug.examples.llama.tiny_llama(layers=N)`` (a dry run, by default
for xnnpack, optionally with ``--compare-stock``), writes the HTML report, then
opens it ``--repeat`` times in Debian's headless Chromium (through Playwright,
connected to the system browser; offline) and reports, per open: the time from
navigation to the page's ``data-ready`` mark (data parsed, graph laid out by
dagre and drawn, tables built), and the page's own script time. The issue's
target is under 2 s.

    python bench/report_open.py                      # 32 layers, xnnpack
    python bench/report_open.py --layers 32 --compare-stock --backend vulkan
    python bench/report_open.py --report saved.json  # an existing JSON report, no lowering
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]


def build_report(layers: int, backend: str, compare_stock: bool):
    import edgeplug
    from edgeplug.examples.llama import tiny_llama
    from edgeplug._stock import stock_partitioning

    model, inputs = tiny_llama(layers=layers)
    t = time.perf_counter()
    report = edgeplug.lower(model, inputs, backend, dry_run=True, model_name=f"tiny_llama(layers={layers})").report
    print(f"lowered {layers} layers for {backend} (dry run) in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    if compare_stock:
        report.stock = stock_partitioning(model, inputs, edgeplug.get_backend(backend))
    return report


def open_times(html: Path, repeat: int, chromium: str) -> list[tuple[float, float, int, int]]:
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        for _ in range(repeat):
            context = browser.new_context(offline=True)
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            t = time.perf_counter()
            page.goto(html.resolve().as_uri())
            page.wait_for_selector("body[data-ready='1']", timeout=60000)
            wall = time.perf_counter() - t
            if errors:
                raise SystemExit(f"the page raised: {errors}")
            script = page.evaluate("performance.now()") / 1000
            boxes = page.evaluate("document.querySelectorAll('g.node, g.group').length")
            nodes = page.evaluate("JSON.parse(document.getElementById('edgeplug-report').textContent).graph.length")
            out.append((wall, script, boxes, nodes))
            context.close()
        browser.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--backend", default="xnnpack")
    ap.add_argument("--compare-stock", action="store_true")
    ap.add_argument("--report", help="a saved JSON report to render instead of lowering")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--keep", help="also write the page here")
    args = ap.parse_args(argv)

    from edgeplug._report.html import load_report, render_html

    report = load_report(args.report) if args.report else build_report(args.layers, args.backend, args.compare_stock)
    page = render_html(report)
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(args.keep) if args.keep else Path(tmp) / "report.html"
        html.write_text(page, encoding="utf-8")
        times = open_times(html, args.repeat, args.chromium)
    walls = [t[0] for t in times]
    _, _, boxes, nodes = times[0]
    print(f"page: {len(page.encode()) / 1e6:.2f} MB, {nodes} graph nodes, {boxes} boxes drawn at first open")
    print(f"open to ready, {args.repeat} opens: median {statistics.median(walls):.3f} s, max {max(walls):.3f} s "
          f"(target < 2 s); script time at ready: median {statistics.median(t[1] for t in times):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
