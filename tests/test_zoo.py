"""The model zoo, reduced: 2 architectures x 2 backends through bench/zoo.py's own code.

The full matrix (``make zoo``) writes docs/zoo.md; this runs the same
``run_cell`` on one-layer Llama and Qwen3 for xnnpack (its .pte runs in
executorch's runtime) and vulkan (host kernels on the wgpu adapter), each
against stock executorch in the same process, and checks what the zoo
claims: it lowers, every norm is fused or recorded with a reason, the lowered
program computes what eager computes, and edgeplug breaks the graph no more
than stock does. Each cell runs once per session.
"""

from __future__ import annotations


import pytest

pytest.importorskip("transformers")

MODELS = ["llama"]  # the rest of the zoo runs in `make zoo`
BACKENDS = ["xnnpack", "vulkan"]


@pytest.fixture(scope="session")
def cells(zoo):
    """(model, backend) -> Cell, lowered on first use: one layer, no timing warm-up."""
    import edgeplug

    cache: dict = {}

    def get(model: str, backend: str):
        if backend not in edgeplug.backends():
            pytest.skip(f"backend {backend!r} is not installed")
        if (model, backend) not in cache:
            cache[(model, backend)] = zoo.run_cell(model, backend, layers=1, warm=False)
        return cache[(model, backend)]

    return get


def _table(zoo, cell) -> str:
    return zoo.render([cell], "python bench/zoo.py (test)", 1, 0.0)


@pytest.mark.parametrize("backend", [pytest.param(b, marks=[pytest.mark.slow] if b == "vulkan" else []) for b in BACKENDS])
@pytest.mark.parametrize("model", MODELS)
def test_zoo_cell(zoo, cells, model, backend):
    cell = cells(model, backend)
    table = _table(zoo, cell)
    assert not cell.error, table
    e, s = cell.edgeplug, cell.stock
    assert e.ok, table
    assert s.ok, table  # stock lowers these two: a stock failure here is news

    # every norm of the program is fused or has a fusion record with a reason
    assert cell.norms_present == {"llama": 3, "qwen3": 5}[model]  # 2 per layer + final (+ q/k norms)
    if cell.no_policy:
        assert cell.fusion_outcomes == {}, table  # nothing fuses without a policy
    else:
        assert cell.norms_recorded == cell.norms_present, table
        assert all(reason for _, reason in cell.rejected), table

    # numbers: the lowered program against eager
    assert e.verify_error == "", table
    assert e.max_abs_diff is not None and e.max_abs_diff <= 1e-4, table
    assert e.verify_passed in (True, None), table  # None: a report without a verdict

    # not worse than stock
    assert e.partitions <= s.partitions, table
    assert e.cpu_nodes <= s.cpu_nodes, table
    assert e.seconds > 0 and s.seconds > 0

    # issue 13's targets on a decoder: constant folding and the backend's rewrites
    if backend == "vulkan":  # the whole decoder in one partition, nothing on the CPU
        assert (e.partitions, e.cpu_nodes) == (1, 0), table
    if backend == "xnnpack":  # at most a third of stock's graph breaks, no norm op on the CPU
        assert 3 * e.partitions <= s.partitions and 3 * e.cpu_nodes <= s.cpu_nodes, table
        assert not set(e.cpu_ops) & {"aten.mean.dim", "aten.rsqrt.default", "aten.pow.Tensor_Scalar"}, table


def test_zoo_counts_cpu_nodes_like_the_report(zoo, cells):
    """Stock's CPU nodes are counted before to_executorch rewrites them, in the report's op spelling."""
    cell = cells("llama", "xnnpack")
    assert not cell.error and cell.stock.ok
    ops = set(cell.stock.cpu_ops)
    assert all(op.count(".") >= 2 for op in ops), ops  # 'aten.mean.dim', never a pybind repr
    assert not any(op.startswith(("executorch_prim", "memory.")) or "alloc" in op for op in ops), ops
    assert cell.stock.max_abs_diff is not None and cell.stock.max_abs_diff <= 1e-4


def test_zoo_failing_cell_is_a_row_not_a_crash(zoo, monkeypatch):
    monkeypatch.setitem(zoo.MODELS, "broken", zoo.Arch("NoSuchConfig", "NoSuchModel"))
    cell = zoo.run_cell("broken", "xnnpack", warm=False)
    assert cell.error.startswith("build/export: AttributeError"), cell.error
    doc = zoo.render([cell], "python bench/zoo.py --models broken", 1, 0.0)
    assert "| broken | xnnpack | **fails**: build/export: AttributeError" in doc
    assert "python bench/zoo.py --models broken" in doc


def test_zoo_stock_failure_is_shown_beside_edgeplug(zoo, cells):
    cell = cells("llama", "xnnpack")

    class Boom:
        def __init__(self) -> None:
            raise RuntimeError("stock partitioner exploded\nsecond line")

    target = zoo.Target(False, Boom)
    module, ep, inputs, _ = zoo.exported("llama", 1)
    side = zoo.lower_stock(ep, inputs, [], target)
    assert not side.ok and side.error == "RuntimeError: stock partitioner exploded"
    cell = zoo.Cell.from_dict({**zoo.asdict(cell), "stock": zoo.asdict(side)})
    doc = zoo.render([cell], "cmd", 1, 0.0)
    assert "**fails**: RuntimeError: stock partitioner exploded" in doc
    assert "second line" not in doc


def test_zoo_rejects_unknown_names(zoo):
    with pytest.raises(SystemExit, match="unknown model"):
        zoo.main(["--models", "llama,not-a-model", "--out", "-"])
    with pytest.raises(SystemExit, match="unknown backend"):
        zoo.main(["--backends", "vulcan", "--out", "-"])


def test_zoo_main_writes_after_every_cell(zoo, monkeypatch, tmp_path):
    """The markdown and JSON are rewritten after each cell, so a run stopped early keeps its figures."""
    import json

    monkeypatch.setitem(zoo.MODELS, "broken", zoo.Arch("NoSuchConfig", "NoSuchModel"))
    seen: list[int] = []
    cells = zoo.run_matrix(["broken"], ["xnnpack", "qnn"], jobs=1, say=lambda m: None, on_cell=lambda c: seen.append(len(c)))
    assert seen == [1, 2] and [c.backend for c in cells] == ["xnnpack", "qnn"]

    out, js = tmp_path / "zoo.md", tmp_path / "zoo.json"
    assert zoo.main(["--models", "broken", "--backends", "xnnpack,qnn", "--jobs", "1", "--out", str(out), "--json", str(js)]) == 0
    doc = out.read_text()
    assert "| broken | qnn (dry run) | **fails**: build/export" in doc and "partial" not in doc
    data = json.loads(js.read_text())
    assert data["summary"]["cells"] == 2 and data["summary"]["edgeplug_failures"] == 2
    assert not list(tmp_path.glob("*.tmp"))


def _vulkan_cell(zoo, model, partitions, reasons):
    side = zoo.Side(ok=True, partitions=partitions, cpu_ops={op: 1 for op in reasons},
                    cpu_reasons={op: [why] for op, why in reasons.items()})
    return zoo.Cell(model=model, backend="vulkan", dry_run=False, edgeplug=side)


def test_vulkan_target_allows_only_splits_at_ops_without_a_kernel(zoo):
    """Issue 13's Vulkan line: an op with no kernel may stay (and split the graph); nothing else may."""
    no_kernel = "Vulkan: no operator implementation"
    met = [
        _vulkan_cell(zoo, "llama", 1, {}),
        _vulkan_cell(zoo, "falcon-mamba", 2, {"aten.log1p.default": no_kernel}),
    ]
    [line] = [t for t in zoo.targets(met) if t.startswith("vulkan:")]
    assert line.endswith("— met") and "falcon-mamba 2 (log1p.default)" in line

    high_dim = _vulkan_cell(zoo, "bamba", 4, {"aten.cumsum.default": no_kernel,
                                              "aten.exp.default": "Vulkan: op does not support high dim tensors"})
    two_without_cause = _vulkan_cell(zoo, "qwen3", 2, {})  # split with nothing kernel-less on the CPU
    for bad in (high_dim, two_without_cause):
        [line] = [t for t in zoo.targets([*met, bad]) if t.startswith("vulkan:")]
        assert line.endswith("— not met"), line
    [line] = [t for t in zoo.targets([*met, high_dim]) if t.startswith("vulkan:")]
    assert "bamba: exp.default" in line


def test_xnnpack_target_counts_a_stock_failure_as_nothing_to_divide(zoo):
    def cell(model, ours, stock, stock_error=""):
        return zoo.Cell(
            model=model, backend="xnnpack", dry_run=False,
            edgeplug=zoo.Side(ok=True, partitions=ours[0], cpu_ops={"aten.embedding.default": ours[1]}),
            stock=zoo.Side(ok=not stock_error, error=stock_error, partitions=stock[0],
                           cpu_ops={"aten.embedding.default": stock[1]} if not stock_error else {}),
        )

    good = cell("llama", (2, 7), (9, 65))
    failed = cell("olmoe", (8, 60), (0, 0), stock_error="SpecViolationError: aten.histc")
    [line] = [t for t in zoo.targets([good, failed]) if t.startswith("xnnpack:")]
    assert line.endswith("— met") and "stock fails on olmoe" in line
    over = cell("bamba", (4, 13), (11, 70))  # 4 partitions > 11 / 3
    [line] = [t for t in zoo.targets([good, failed, over]) if t.startswith("xnnpack:")]
    assert line.endswith("— not met")
