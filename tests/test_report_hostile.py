"""The HTML report with hostile names (issue 37): a model, a custom op and a plugin whose names are
HTML/JS payloads, lowered and rendered through the ``edgeplug`` command, give a page that Chromium
(Debian's, never a downloaded one) opens with no injected element and no script run, every payload
shown as text; so does a saved report whose every string is a payload. A saved JSON that is not a
report edgeplug reads is refused with one line, and nothing is written.

The model and the plugin: tests/fixtures/hostile_names/hostile_names.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "hostile_names"
CHROMIUM = shutil.which("chromium")  # `browser` (tests/conftest.py) drives the same one through Playwright
NO_CHROMIUM = "Debian's chromium is not installed here (apt-get install -y chromium; .ci/run installs it)"
#: what every string of the tampered saved report gains: each markup context's way out at once
SUFFIX = " \"'><img src=x onerror=alert('PWNED')></script><script>alert('PWNED')</script><!--<svg onload=alert(1)>&amp;"
#: what the page itself holds and nothing may add to: its scripts (data, dagre, its own), its style, its graph
PAGE_ELEMENTS = {"script": 3, "style": 1, "svg": 1, "link": 1, "meta": 2}


@pytest.fixture(scope="module")
def hostile():
    if str(FIXTURE) not in sys.path:
        sys.path.insert(0, str(FIXTURE))
    import hostile_names

    return hostile_names


def _edgeplug(*argv: object) -> tuple[int, str, str]:
    """The ``edgeplug`` command in this process: (exit code, stdout, stderr)."""
    from edgeplug._cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def _tampered(value, key=None):
    """``value`` (a saved report's JSON) with SUFFIX on every non-empty string and dict key, except the
    fields whose values are a fixed set (kind, outcome, pattern) and the placeholders' op (input, weight, output)."""
    if isinstance(value, dict):
        return {(k + SUFFIX if key in ("ops", "delegated_ops", "cpu_ops") else k): _tampered(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_tampered(v, key) for v in value]
    if isinstance(value, str) and value and key not in ("kind", "outcome", "pattern") and value not in ("input", "weight", "output"):
        return value + SUFFIX
    return value


@pytest.fixture(scope="module")
def pages(hostile, tmp_path_factory):
    """``edgeplug lower model.py:model -b fixture-keep -o h.pte --report h.json`` with the hostile plugin,
    ``edgeplug report h.json --html h.html``, and the same for the tampered copy t.json."""
    import edgeplug
    import edgeplug_fixture_backends as fb

    tmp = tmp_path_factory.mktemp("hostile")
    plugin = hostile.HostilePlugin()
    with fb.registered():
        edgeplug.register_plugin(plugin, hostile.PLUGIN_NAME)
        try:
            code, _, err = _edgeplug("lower", f"{FIXTURE / 'model.py'}:model", "-b", hostile.BACKEND, "-q",
                                     "-o", tmp / "h.pte", "--report", tmp / "h.json")
        finally:
            edgeplug.unregister_plugin(plugin)
    assert code == 0, err
    report = json.loads((tmp / "h.json").read_text())
    (tmp / "t.json").write_text(json.dumps(_tampered(report)))
    for name in ("h", "t"):
        code, _, err = _edgeplug("report", tmp / f"{name}.json", "--html", tmp / f"{name}.html")
        assert code == 0, err
    return tmp


def test_the_hostile_lowering_carries_every_payload_into_the_report(hostile, pages):
    """The strings reach the report as the model and the plugin gave them (else the page tests prove nothing)."""
    report = json.loads((pages / "h.json").read_text())
    P = hostile.PAYLOADS
    assert report["format_version"] == 1
    modules = {n["module"] for n in report["graph"]}
    assert {P[k] for k in hostile.MODULES} | {P["proto"]} <= modules  # module paths, verbatim
    assert {f"{hostile.NAMESPACE}.constructor.default", f"{hostile.NAMESPACE}.__proto__.default"} <= set(report["cpu_ops"])
    assert any(hostile.REASON in c["reason"] for c in report["cpu_nodes"])  # the plugin's filter's reason
    assert [(t["transform"], t["detail"]) for t in report["transforms"] if t["transform"] == hostile.PASS_NAME] == [
        (hostile.PASS_NAME, hostile.DETAIL)]
    assert any(hostile.PASS_NAME in n and hostile.PLUGIN_NAME in n for n in report["notes"])  # whose pass it was
    # the parameter and buffer names reach the graph as torch.export names the placeholders (sanitized)
    weights = [n["name"] for n in report["graph"] if n["op"] == "weight"]
    assert any("onerror" in w for w in weights) and any("svg_onload" in w for w in weights)


def test_the_page_data_reads_back_as_the_report_and_cannot_close_its_element(pages):
    """The report inlined in the page is the JSON itself; no "<" in it can end the data element or
    open a comment, and JSON.parse reads it (a "<!--" once made it "<\\!--", which JSON refuses)."""
    for name in ("h", "t"):
        page = (pages / f"{name}.html").read_text()
        start = page.index('<script type="application/json" id="edgeplug-report">') + len(
            '<script type="application/json" id="edgeplug-report">')
        data = page[start:page.index("</script>", start)]
        assert "<" not in data and ">" not in data
        report = json.loads((pages / f"{name}.json").read_text())
        report.pop("summary")
        inlined = json.loads(data)
        inlined.pop("summary")
        assert inlined == report


# -- in Chromium --------------------------------------------------------------------------------


_TEXTS = ("td", "li", "h1", "title")


class _Dom(HTMLParser):
    """Every element of a serialized DOM, its attributes, and the text of each table cell, list item,
    heading and title (``texts``: (tag, text))."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.texts: list[tuple[str, str]] = []
        self._text: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, {k: v or "" for k, v in attrs}))
        if tag in _TEXTS:
            self._text = []

    def handle_endtag(self, tag):
        if tag in _TEXTS and self._text is not None:
            self.texts.append((tag, "".join(self._text)))
            self._text = None

    def handle_data(self, data):
        if self._text is not None:
            self._text.append(data)


def _injected(elements: list[tuple[str, dict[str, str]]]) -> list[str]:
    """What no report page holds: an event handler, a link or source, an element beyond the page's own."""
    bad = [f"<{t} {a}>" for t, attrs in elements for a in attrs if a.startswith("on")]
    bad += [f"<{t} {a}={v!r}>" for t, attrs in elements for a, v in attrs.items()
            if a in ("href", "src", "xlink:href", "action", "formaction", "srcdoc") and (t, v) != ("link", "data:,")]
    count: dict[str, int] = {}
    for t, _ in elements:
        if t in (*PAGE_ELEMENTS, "img", "iframe", "object", "embed", "base", "form", "a", "video", "audio", "math"):
            count[t] = count.get(t, 0) + 1
    count.pop("a", None)  # the search's matches are <a data-goto> (no href: checked above)
    if count != PAGE_ELEMENTS:
        bad.append(f"elements {count}, the page's own are {PAGE_ELEMENTS}")
    return bad


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
@pytest.mark.parametrize("name", ["h", "t"], ids=["lowered", "tampered-json"])
def test_chromium_runs_no_payload_and_shows_each_as_text(hostile, pages, name):
    """``chromium --headless=new --dump-dom``: the page's script finished (data-ready), the title is the
    report's, no element was injected and the plugin's strings are table text (NUL dropped by the parser)."""
    html = pages / f"{name}.html"
    run = subprocess.run(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--virtual-time-budget=3000", "--dump-dom", html.as_uri()],
        capture_output=True, text=True, timeout=120, env={"HOME": str(pages), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    dom = _Dom()
    dom.feed(run.stdout)
    body = [attrs for t, attrs in dom.elements if t == "body"]
    assert body == [{"data-ready": "1"}], "the page's own script did not finish"
    assert _injected(dom.elements) == []
    assert "PWNED" not in "".join(t for t, _ in dom.elements)
    suffix = SUFFIX if name == "t" else ""
    cells = [text for tag, text in dom.texts if tag in ("td", "li")]
    assert any((hostile.REASON + suffix).replace("\0", "") in c for c in cells), "the filter's reason, as text"
    assert hostile.PASS_NAME + suffix in cells and hostile.DETAIL + suffix in cells  # the transforms table
    assert any(hostile.PASS_NAME in c and hostile.PLUGIN_NAME in c for c in cells)  # the note
    report = json.loads((pages / f"{name}.json").read_text())
    assert [(tag, text) for tag, text in dom.texts if tag in ("title", "h1")] == [
        ("title", f"edgeplug: {report['model']} -> {report['backend']}"),
        ("h1", f"edgeplug lowering report: {report['model']} \u2192 {report['backend']}"),
    ]


_DOM_CHECK = """() => Array.from(document.querySelectorAll('*')).map(e =>
    [e.tagName.toLowerCase(), Object.fromEntries(Array.from(e.attributes).map(a => [a.name, a.value]))])"""


@pytest.mark.parametrize("name", ["h", "t"], ids=["lowered", "tampered-json"])
def test_every_view_of_the_page_runs_no_payload(hostile, pages, browser, name):
    """Driven as a reader would: each node clicked (its detail pane), its module collapsed, the search
    given each payload, the tables sorted. After each, no dialog, no console error, no injected element,
    the title unchanged; a node's module path reads back exactly as the model named it."""
    report = json.loads((pages / f"{name}.json").read_text())
    context = browser.new_context(offline=True)
    page = context.new_page()
    dialogs, errors = [], []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((pages / f"{name}.html").as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=20000)
    title = f"edgeplug: {report['model']} -> {report['backend']}"

    def clean(after: str) -> None:
        assert (dialogs, errors) == ([], []), after
        assert _injected(page.evaluate(_DOM_CHECK)) == [], after
        assert page.title() == title, after

    clean("opening")
    # no module is drawn collapsed before it is asked ("constructor", "__proto__": Object's own members in JS)
    assert page.eval_on_selector_all("g.group", "gs => gs.map(g => g.dataset.group)") == []
    calls = [n for n in report["graph"] if n["op"] not in ("input", "weight", "output")]
    for n in calls:
        page.evaluate("""name => Array.from(document.querySelectorAll('g.node')).find(g => g.dataset.name === name)
                         .dispatchEvent(new MouseEvent('click', {bubbles: true}))""", n["name"])
        rows = dict(page.eval_on_selector_all("#detail dt", "dts => dts.map(d => [d.textContent, d.nextElementSibling.textContent])"))
        assert rows["node"] == n["name"] and rows["op"] == n["op"]
        assert rows["module"] == (n["module"] or "(none)")
        if not n["partition"]:
            assert rows["on the CPU"] == n["reason"].replace("\0", "")
        clean(f"selecting {n['name']!r}")
    modules = sorted({n["module"] for n in calls if n["module"]})
    assert {hostile.PAYLOADS["ctor"] + ("" if name == "h" else SUFFIX), hostile.PAYLOADS["proto"] + ("" if name == "h" else SUFFIX)} <= set(modules)
    for module in modules:
        node = next(n for n in calls if n["module"] == module)
        page.evaluate("""([name, module]) => {
            Array.from(document.querySelectorAll('g.node')).find(g => g.dataset.name === name)
              .dispatchEvent(new MouseEvent('click', {bubbles: true}));
            Array.from(document.querySelectorAll('#detail button')).find(b => b.dataset.collapse === module).click();
        }""", [node["name"], module])
        assert module in page.eval_on_selector_all("g.group", "gs => gs.map(g => g.dataset.group)")
        clean(f"collapsing {module!r}")
    page.click("#expand")
    assert page.eval_on_selector_all("g.group", "gs => gs.length") == 0
    for payload in [*hostile.PAYLOADS.values(), SUFFIX]:
        page.fill("#search", payload)
        page.press("#search", "Enter")
        clean(f"searching {payload!r}")
    page.fill("#search", calls[0]["name"])
    assert calls[0]["name"] in page.eval_on_selector_all("#matches a", "as => as.map(a => a.textContent)")
    for th in ("#cpu-nodes th:nth-child(3)", "#transforms th:nth-child(8)"):
        page.click(th)
        clean(f"sorting by {th}")
    notes = page.eval_on_selector_all("#notes li", "lis => lis.map(li => li.textContent)")
    assert notes == report["notes"]
    context.close()


# -- a saved JSON that is not a report edgeplug reads -----------------------------------------------

_REFUSED = {
    "truncated": ('{"format_version": 1, "model": "m", "backend": "b", "distribution', "is not JSON"),
    "not-utf8": (b'{"model": "\xff\xfe"}', "is not JSON"),
    "nested-too-deep": ("[" * 200_000 + "]" * 200_000, "is not JSON"),
    "a-list": ("[1, 2]", "holds JSON (list) but not a lowering report"),
    "wrong-field-type": ('{"model": 3, "backend": "b", "distribution": "d"}', "(model: Input should be a valid string)"),
    "missing-fields": ('{"format_version": 1, "graph": []}', "(model: Field required (and 2 more))"),
    "bad-format-version": ('{"format_version": "2", "model": "m", "backend": "b", "distribution": "d"}', "(format_version '2')"),
    "newer-format": ('{"format_version": 99, "model": "m", "backend": "b", "distribution": "d", "new_field": {}}',
                     "is a report of format 99, newer than this edgeplug"),
}


@pytest.mark.parametrize("case", list(_REFUSED))
def test_report_refuses_what_it_cannot_read_in_one_line_and_writes_nothing(cli, tmp_path, case):
    content, says = _REFUSED[case]
    saved = tmp_path / "saved.json"
    saved.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, out, err = cli("report", saved, "--html", tmp_path / "page.html", "--explore", tmp_path / "me")
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgeplug: error: "), err
    assert str(saved) in lines[0] and says in lines[0], lines[0]
    fix = "upgrade edgeplug" if case == "newer-format" else "give the file `edgeplug lower --report X.json` wrote"
    assert fix in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved.json"]  # no page, no Model Explorer folder


def test_a_report_of_this_format_or_one_without_the_field_is_read(cli, tmp_path):
    """The negative case: format 1, and a report from before the field (format 1 by definition), render."""
    base = {"model": "m", "backend": "b", "distribution": "d"}
    for version in (None, 1):
        saved = tmp_path / f"r{version}.json"
        saved.write_text(json.dumps(base if version is None else {**base, "format_version": version}))
        code, out, err = cli("report", saved, "--html", tmp_path / f"r{version}.html")
        assert code == 0, err
        assert out.startswith("edgeplug lowering report: m -> b") and (tmp_path / f"r{version}.html").stat().st_size
