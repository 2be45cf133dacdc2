"""The HTML report, the stock comparison and Model Explorer's files, checked where people see them:
the page in Debian's Chromium (driven by Playwright, never a downloaded browser), the overlays
through Model Explorer's own Python package."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import edgeplug
from edgeplug._report.records import GraphNode, LoweringReport, PartitionSummary

# `browser`: Debian's chromium through Playwright, one for the session (tests/conftest.py)


class Page:
    """One page opened offline: what it requested off the file system, and its console errors."""

    def __init__(self, browser, path: Path) -> None:
        self.context = browser.new_context(offline=True)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(path.resolve().as_uri())
        self.page.wait_for_selector("body[data-ready='1']", timeout=20000)

    def all(self, selector: str, attr: str) -> list[str]:
        return self.page.eval_on_selector_all(selector, f"els => els.map(e => e.getAttribute({attr!r}))")

    def close(self) -> None:
        assert not self.errors, f"console errors: {self.errors}"
        assert [u for u in self.requests if not u.startswith(("file:", "data:"))] == []
        self.context.close()


def _check_page_against_report(browser, html: Path, report: dict) -> None:
    p = Page(browser, html)
    page = p.page
    calls = {tag: 0 for tag in ()}
    for tag in p.all("g.node[data-partition]", "data-partition"):
        calls[tag] = calls.get(tag, 0) + 1
    # the partitions the DOM draws are the report's, node for node
    assert calls == {q["tag"]: q["nodes"] for q in report["partitions"]}
    assert sorted(p.all("g.node[data-cpu]", "data-name")) == sorted(c["node"] for c in report["cpu_nodes"])
    assert page.inner_text("#sum-partitions b") == str(len(report["partitions"]))
    assert page.inner_text("#sum-cpu b") == str(report["summary"]["cpu_nodes"])
    for c in report["cpu_nodes"][:3]:  # clicking a CPU node shows why it stayed there
        page.click(f"#cpu-nodes td:text-is('{c['node']}')")  # the table row brings the node into view
        page.click(f"g.node[data-name='{c['node']}']")
        assert page.inner_text("#detail .reason") == c["reason"]
        assert page.inner_text("#detail dd:nth-of-type(1)") == c["node"]
    if report.get("stock") and not report["stock"]["error"]:
        s = report["stock"]
        rows = {r[0]: r[1:] for r in page.eval_on_selector_all(
            "#compare tr", "trs => trs.map(t => Array.from(t.cells).map(c => c.textContent))")}
        assert rows["partitions"] == [str(len(report["partitions"])), str(len(s["partitions"])),
                                      str(len(report["partitions"]) - len(s["partitions"]))]
        assert rows["CPU nodes"][:2] == [str(sum(report["cpu_ops"].values())), str(sum(s["cpu_ops"].values()))]
        page.check("#view-stock")  # the stock partitioning of the same model, in the same graph view
        drawn = {}
        for tag in p.all("g.node[data-partition]", "data-partition"):
            drawn[tag] = drawn.get(tag, 0) + 1
        assert drawn == {q["tag"]: q["nodes"] for q in s["partitions"]}
        assert len(p.all("g.node[data-cpu]", "data-name")) == sum(s["cpu_ops"].values())
    p.close()


@pytest.mark.slow
def test_cli_report_html_and_explore_for_llama(cli, tmp_path, browser, fixture_backends):
    """`lower llama --report r.json --compare-stock --explore`, then `report r.json --html`: the page
    opens offline, shows both partitionings with the report's counts; Model Explorer reads the files.
    The backend partitions with executorch's own (demo) partitioner, so the stock flow exists."""
    code, _out, err = cli("lower", "llama", "-b", fixture_backends.STOCK, "--dry-run", "-q", "--report", str(tmp_path / "r.json"),
                          "--compare-stock", "--explore", str(tmp_path / "me"))
    assert code == 0, err
    code, out, err = cli("report", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"))
    assert code == 0, err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["stock"]["partitions"] and not report["stock"]["error"]
    # the stock side is the same partitioning record: its CPU nodes, one by one, add up to its counts
    stock_cpu = report["stock"]["cpu_nodes"]
    assert stock_cpu and {op: sum(c["op"] == op for c in stock_cpu) for op in report["stock"]["cpu_ops"]} == report["stock"]["cpu_ops"]
    assert len(stock_cpu) == sum(report["stock"]["cpu_ops"].values())
    html = (tmp_path / "r.html").read_text()
    assert "<script src" not in html and "<link rel=\"stylesheet\"" not in html
    _check_page_against_report(browser, tmp_path / "r.html", report)
    _check_explorer_files(tmp_path / "me", report)


@pytest.mark.slow
def test_html_report_of_llama_with_fusions_and_no_stock_flow(edgeplug_lowering, tmp_path, browser, fixture_backends):
    from edgeplug._report.html import write_report
    from edgeplug._stock import stock_partitioning
    from edgeplug.examples import load_model

    report = edgeplug_lowering("llama", fixture_backends.FUSED).report.model_copy(deep=True)
    model, inputs, _, _ = load_model("llama")
    # its partitioner is not executorch's: the comparison says there is no stock flow, and the page still opens
    report.stock = stock_partitioning(model, inputs, edgeplug.get_backend(fixture_backends.FUSED))
    assert "not an executorch partitioner" in report.stock.error
    write_report(tmp_path / "v.html", report)
    assert report.graph and report.fusions  # it fuses rms_norm: the page shows which node it made
    assert any(n.fusion for n in report.graph)
    _check_page_against_report(browser, tmp_path / "v.html", json.loads(report.to_json()))


def _check_explorer_files(folder: Path, report: dict) -> None:
    dacite = pytest.importorskip("dacite")
    gb = pytest.importorskip("model_explorer.graph_builder", reason="ai-edge-model-explorer is not installed")
    nd = pytest.importorskip("model_explorer.node_data_builder")
    collection = dacite.from_dict(gb.GraphCollection, json.loads((folder / "graph.json").read_text()))
    (graph,) = collection.graphs
    ids = {n.id for n in graph.nodes}
    assert ids == {n["name"] for n in report["graph"]}
    overlays = {}
    for name in ("partition", "cpu"):
        data = json.loads((folder / f"{name}.json").read_text())
        overlays[name] = dacite.from_dict(nd.GraphNodeData, data[graph.id])
    assert set(overlays["partition"].results) == ids  # every node has its partition overlay
    cpu = {k for k, r in overlays["cpu"].results.items() if r.value == 1}
    assert cpu == {c["node"] for c in report["cpu_nodes"]}
    import model_explorer

    model_explorer.config().add_model_from_path(str(folder / "graph.json")).add_node_data_from_path(str(folder / "partition.json"))


# -- without a lowering: a big synthetic graph, and the refusals ------------------------------------


def _decoder_report(layers: int, per_layer: int = 40) -> LoweringReport:
    """A report shaped like a decoder's: ``layers`` blocks of ``per_layer`` chained nodes, one CPU node each."""
    nodes = [GraphNode(name="tokens", op="input")]
    prev, ops = "tokens", {}
    for i in range(layers):
        for j in range(per_layer):
            name = f"b{i}_n{j}"
            cpu = j == per_layer - 1
            nodes.append(GraphNode(name=name, op="aten.mm.default", inputs=[prev], module=f"blocks.{i}.attn",
                                   partition="" if cpu else "lowered_module_0", reason="refused by a test" if cpu else "",
                                   shape="[1, 64]", dtype="float32"))
            prev = name
    nodes.append(GraphNode(name="output", op="output", inputs=[prev]))
    delegated = layers * (per_layer - 1)
    return LoweringReport(
        model="decoder", backend="test", distribution="test",
        partitions=[PartitionSummary(tag="lowered_module_0", backend_id="TestBackend", nodes=delegated, ops={"aten.mm.default": delegated})],
        delegated_ops={"aten.mm.default": delegated}, cpu_ops={"aten.mm.default": layers},
        cpu_nodes=[{"node": f"b{i}_n{per_layer - 1}", "op": "aten.mm.default", "reason": "refused by a test"} for i in range(layers)],
        graph=nodes,
    )


def test_a_big_graph_opens_collapsed_and_expands_by_module(browser, tmp_path):
    from edgeplug._report.html import write_report

    write_report(tmp_path / "big.html", _decoder_report(layers=12))
    p = Page(browser, tmp_path / "big.html")
    page = p.page
    groups = p.all("g.group", "data-group")
    assert sorted(groups) == sorted(f"blocks.{i}" for i in range(12))
    assert p.all("g.group", "data-cpu-count") == ["1"] * 12
    page.click("g.group[data-group='blocks.3']")  # expands that layer only
    assert len(p.all("g.node[data-name^='b3_']", "data-name")) == 40
    assert "blocks.3" not in p.all("g.group", "data-group")
    page.click("g.node[data-name='b3_n1']")  # any module above a node collapses: blocks.3.attn here
    page.click("#detail button[data-collapse='blocks.3.attn']")
    assert "blocks.3.attn" in p.all("g.group", "data-group")
    assert p.all("g.node[data-name^='b3_']", "data-name") == []
    page.fill("#search", "b7_n39")  # search reaches into a collapsed layer
    page.press("#search", "Enter")
    assert page.inner_text("#detail .reason") == "refused by a test"
    page.click("#cpu-nodes th:first-child")  # sortable: descending after a second click
    page.click("#cpu-nodes th:first-child")
    first = page.inner_text("#cpu-nodes tbody tr:first-child td:first-child")
    assert first == max(f"b{i}_n39" for i in range(12))
    page.click("#cpu-nodes tbody tr:last-child")  # a row selects its node in the graph
    assert page.inner_text("#detail dd:nth-of-type(1)") == min(f"b{i}_n39" for i in range(12))
    p.close()


def test_report_json_round_trips_and_html_is_self_contained(tmp_path):
    from edgeplug._report.html import load_report, render_html

    report = _decoder_report(layers=2)
    report.notes.append("</script><script>alert(1)</script>")  # data cannot close the data element
    (tmp_path / "r.json").write_text(report.to_json())
    again = load_report(tmp_path / "r.json")
    assert again.graph == report.graph and again.partitions == report.partitions
    html = render_html(again)
    assert html.count("</script>") == 3 and "http://" not in html.split("<script>", 1)[0]
    assert "Copyright (c) 2012-2014 Chris Pettitt" in html  # dagre's MIT license travels with it


def test_report_command_refuses_what_is_not_a_report(cli, tmp_path):
    (tmp_path / "bad.json").write_text('{"model": 3}')
    code, _out, err = cli("report", str(tmp_path / "bad.json"), "--html", str(tmp_path / "x.html"))
    assert code == 2 and "not a lowering report" in err and not (tmp_path / "x.html").exists()
    (tmp_path / "r.json").write_text(_decoder_report(1).to_json())
    code, _out, err = cli("report", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.json"))
    assert code == 2 and "would replace the report it reads" in err
    code, _out, err = cli("report", str(tmp_path / "missing.json"))
    assert code == 2 and "cannot read the report" in err


def test_explore_refuses_a_report_without_graph(tmp_path):
    from edgeplug._errors import EdgeplugError
    from edgeplug._explorer import write_explorer

    pytest.importorskip("model_explorer")
    with pytest.raises(EdgeplugError, match="holds no graph"):
        write_explorer(LoweringReport(model="m", backend="b", distribution="d"), tmp_path / "me")
    assert not (tmp_path / "me").exists()


def test_a_report_saved_before_the_shared_partitioning_record_reads_the_same(cli, tmp_path):
    """A report as edgeplug wrote it before the report and the stock comparison shared one partitioning
    record (its fields at the top level, the stock section without ``cpu_nodes``) is read, shown with the
    same counts, and written back in the same layout, the report's header first."""
    old = {
        "format_version": 1, "model": "m", "backend": "b", "distribution": "d", "dry_run": True, "stand_in": None,
        "stages": [{"stage": "export", "seconds": 0.5}],
        "partitions": [{"tag": "p0", "backend_id": "B", "nodes": 3, "ops": {"aten.mm.default": 3}}],
        "delegated_ops": {"aten.mm.default": 3}, "cpu_ops": {"aten.relu.default": 2},
        "cpu_nodes": [{"node": f"relu_{i}", "op": "aten.relu.default", "reason": "not in B's table"} for i in range(2)],
        "notes": [], "graph": [],
        "stock": {"flow": "stock()", "partitions": [{"tag": "s0", "backend_id": "B", "nodes": 1, "ops": {"aten.mm.default": 1}},
                                                     {"tag": "s1", "backend_id": "B", "nodes": 1, "ops": {"aten.mm.default": 1}}],
                  "delegated_ops": {"aten.mm.default": 2}, "cpu_ops": {"aten.relu.default": 2, "aten.mm.default": 1},
                  "graph": [], "error": ""},
        "summary": {"partitions": 1, "delegated_nodes": 3, "cpu_nodes": 2, "max_abs_diff": None, "verified": None},
    }
    (tmp_path / "old.json").write_text(json.dumps(old))
    code, out, err = cli("report", str(tmp_path / "old.json"))
    assert code == 0, err
    lines = out.splitlines()
    assert "partitions: 1 (would delegate 3 nodes)" in lines
    assert "left on CPU (graph breaks): 2 nodes" in lines
    assert "stock executorch (stock()): 2 partitions, 2 nodes delegated, 3 on CPU" in lines
    from edgeplug._report.html import load_report

    again = json.loads(load_report(tmp_path / "old.json").to_json())
    assert list(again)[:7] == ["format_version", "model", "backend", "distribution", "dry_run", "stand_in", "stages"]
    assert again["summary"] == old["summary"] and again["cpu_nodes"] == old["cpu_nodes"]
    assert {k: again["stock"][k] for k in old["stock"]} == old["stock"] and again["stock"]["cpu_nodes"] == []
    assert set(again) == set(old) | {"kept_whole_on_cpu", "decomposed_instead", "fusions", "transforms", "output_path",
                                     "output_bytes", "verification", "quantization"}
