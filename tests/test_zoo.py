"""The model zoo (``edgeplug._zoo``, ``edgeplug zoo``), reduced.

The full matrix (``make zoo``) writes docs/zoo.md. Here: ``run_cell`` on the
one-layer Llama for xnnpack (its .pte runs in executorch's runtime) and vulkan
(host kernels on the wgpu adapter), against stock executorch in the same
process, checks what the zoo claims (it lowers, every norm is fused or recorded
with a reason, the lowered program computes what eager computes, edgeplug breaks
the graph no more than stock does); then the runs themselves, under both
executors: each cell in its own process, a killed worker retried then recorded,
a hang recorded as a timeout, a cell past its memory limit recorded as such, the
same cells from local processes and from Ray, and ``--resume`` after an
interrupted run running only the missing cells. The second backend's cell and the
Ray executor's run (about 75 s together) run with ``EDGEPLUG_ZOO=1``; ``make test``
runs the first backend's cell and the local executor.
"""

from __future__ import annotations


import json
import os

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
    return zoo.render([cell], "edgeplug zoo (test)", 1, 0.0)


WHOLE_SET = os.environ.get("EDGEPLUG_ZOO") == "1"
_ZOO_ONLY = pytest.mark.skipif(not WHOLE_SET, reason="runs with EDGEPLUG_ZOO=1 (`make zoo`)")


@pytest.mark.parametrize("backend", [pytest.param(b, marks=[pytest.mark.slow, _ZOO_ONLY] if b == "vulkan" else []) for b in BACKENDS])
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


def test_zoo_failing_cell_is_a_row_not_a_crash(zoo, fixture_backends, monkeypatch):
    monkeypatch.setitem(zoo.MODELS, "broken", zoo.Arch("NoSuchConfig", "NoSuchModel"))
    cell = zoo.run_cell("broken", fixture_backends.TABLE, warm=False)
    assert cell.error.startswith("build/export: AttributeError"), cell.error
    doc = zoo.render([cell], "edgeplug zoo --models broken", 1, 0.0)
    assert "| broken | fixture-table | float | **fails**: build/export: AttributeError" in doc
    assert "edgeplug zoo --models broken" in doc


def test_zoo_stock_failure_is_shown_beside_edgeplug(zoo, cells):
    cell = cells("llama", "xnnpack")

    class Boom:
        def __init__(self) -> None:
            raise RuntimeError("stock partitioner exploded\nsecond line")

    target = zoo.Target(False, Boom)
    module, ep, inputs, _ = zoo.exported("llama", 1)
    side = zoo.lower_stock(ep, inputs, [], target)
    assert not side.ok and side.error == "RuntimeError: stock partitioner exploded"
    cell = zoo.Cell.from_dict({**cell.to_dict(), "stock": zoo.Cell(model="", backend="", stock=side).to_dict()["stock"]})
    doc = zoo.render([cell], "cmd", 1, 0.0)
    assert "**fails**: RuntimeError: stock partitioner exploded" in doc
    assert "second line" not in doc


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


# --------------------------------------------------------------------------- runs: each cell in its own process

#: the cell models of the run tests, written into each test's folder (the log path is filled in)
CELL_MODELS = '''
import os, signal, time

import torch

LOG = {log!r}


def _started(name):
    """Log this start; how many starts of ``name`` under this executor so far."""
    executor = os.environ.get("EDGEPLUG_ZOO_EXECUTOR")
    with open(LOG, "a") as f:
        f.write(f"{{name}} {{os.getpid()}} {{executor}}\\n")
    return sum(1 for line in open(LOG) if line.split()[0] == name and line.split()[2] == executor)


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.linear(x))


def _tiny():
    torch.manual_seed(0)
    return Tiny().eval(), (torch.randn(2, 8),)


def _kill_worker():
    # the worker: under Ray the task's worker process (this cell process's parent), else this process
    ray = os.environ.get("EDGEPLUG_ZOO_EXECUTOR") == "ray"
    os.kill(os.getppid() if ray else os.getpid(), signal.SIGKILL)
    time.sleep(60)


def tiny():
    _started("tiny")
    return _tiny()


def tiny2():
    _started("tiny2")
    return _tiny()


def killed_once():
    if _started("killed_once") == 1:
        _kill_worker()
    return _tiny()


def killed_always():
    _started("killed_always")
    _kill_worker()


def hangs():
    _started("hangs")
    time.sleep(3600)


def greedy():
    _started("greedy")
    hog = torch.ones(4 << 30, dtype=torch.uint8)  # 4 GiB, past the run's memory limit
    return _tiny()
'''

RUN_TIMEOUT = 40  # s a cell may take: a tiny cell takes about 15 (process start-up and imports) on 2 shared cores
RUN_MEMORY = 3000  # MB


@pytest.fixture(scope="module")
def cell_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zoo-models")
    log = folder / "starts.log"
    (folder / "cells.py").write_text(CELL_MODELS.format(log=str(log)))
    return folder / "cells.py", log


def _starts(log) -> list[str]:
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def _run(zoo, cell_models, out, executor):
    path, log = cell_models
    models = [f"{path}:{f}" for f in ("tiny", "killed_once", "killed_always", "hangs", "greedy")]
    before = len(_starts(log))
    cells = zoo.run(
        models, ["xnnpack"], ["float"], jobs=2, executor=executor, layers=1, retries=1,
        timeout=RUN_TIMEOUT, memory_limit=RUN_MEMORY, out=str(out),
    )
    return {c.label.split(" ")[0]: c for c in cells}, _starts(log)[before:]


@pytest.fixture(scope="module")
def local_run(zoo, cell_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo-local") / "cells.jsonl"
    cells, starts = _run(zoo, cell_models, out, "local")
    return cells, starts, out


@pytest.fixture(scope="module")
def ray_run(zoo, cell_models, tmp_path_factory):
    if not WHOLE_SET:
        pytest.skip("the Ray executor's run takes about 55 s: it runs with EDGEPLUG_ZOO=1 (`make zoo`); make test runs the local one")
    pytest.importorskip("ray", reason="ray is not installed (pip install 'edgeplug[ray]')")
    out = tmp_path_factory.mktemp("zoo-ray") / "cells.jsonl"
    cells, starts = _run(zoo, cell_models, out, "ray")
    return cells, starts, out


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", "ray"])
def test_a_killed_worker_is_retried_then_recorded(executor, request):
    cells, starts, _ = request.getfixturevalue(f"{executor}_run")
    once = cells["killed_once"]
    assert starts.count("killed_once") == 2, starts  # killed, started again, lowered
    assert (once.status, once.attempts) == ("ran", 2), once
    assert once.edgeplug.ok and once.edgeplug.partitions == 1 and once.edgeplug.max_abs_diff is not None

    always = cells["killed_always"]
    assert starts.count("killed_always") == 2, starts  # retries=1: two starts, then no more
    assert (always.status, always.attempts) == ("lost", 2), always
    assert "started 2 times" in always.detail or "lost 2 times" in always.detail, always.detail


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", "ray"])
def test_a_hang_and_a_memory_hog_are_recorded_as_such(executor, request, zoo):
    cells, starts, out = request.getfixturevalue(f"{executor}_run")
    hang, hog = cells["hangs"], cells["greedy"]
    assert "hangs" in starts and "greedy" in starts  # each got as far as its own code
    assert hang.status == "timeout" and f"timeout of {RUN_TIMEOUT} s" in hang.detail, hang
    assert hang.wall_seconds >= RUN_TIMEOUT
    assert hog.status == "memory" and f"{RUN_MEMORY} MB" in hog.detail, hog
    # the run went on: the model beside them lowered and verified
    tiny = cells["tiny"]
    assert tiny.status == "ran" and tiny.edgeplug.ok and tiny.edgeplug.max_abs_diff <= 1e-4, tiny
    # every cell is one JSON line of the results file, and the table shows what became of each
    lines = out.read_text().splitlines()
    assert len(lines) == 5 and {zoo.Cell.from_dict(json.loads(x)).key for x in lines} == {c.key for c in cells.values()}
    text = zoo.table(list(cells.values()))
    assert "timeout: ran past its timeout" in text and "memory: " in text and "lost: " in text
    assert "5 cells: 1 lost, 2 lowered, 1 memory, 1 timeout" in text, text


@pytest.mark.slow
def test_local_and_ray_give_the_same_cells(local_run, ray_run, zoo):
    local, ray = local_run[0], ray_run[0]
    assert set(local) == set(ray)
    for name in local:
        if name == "killed_always":  # lost either way; how it was lost is the executor's to say
            assert local[name].status == ray[name].status == "lost"
            continue
        assert zoo.comparable(local[name]) == zoo.comparable(ray[name]), name


@pytest.mark.slow
def test_resume_after_an_interrupted_run_runs_only_the_missing_cells(tmp_path, zoo):
    import os
    import signal
    import subprocess
    import sys
    import time

    path, log = tmp_path / "cells.py", tmp_path / "starts.log"  # this test's own log of starts
    path.write_text(CELL_MODELS.format(log=str(log)))
    out = tmp_path / "cells.jsonl"
    command = [sys.executable, "-m", "edgeplug._cli", "zoo", "--models", f"{path}:tiny,{path}:tiny2,{path}:hangs",
               "--backends", "xnnpack", "--schemes", "float", "--jobs", "1", "--out", str(out), "--timeout", "300"]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and "hangs" not in _starts(log):  # tiny, tiny2 recorded, hangs running
        assert run.poll() is None, run.communicate()
        time.sleep(0.5)
    hang_pid = int(next(line.split()[1] for line in log.read_text().splitlines() if line.startswith("hangs")))
    run.send_signal(signal.SIGTERM)  # what CI's cancellation sends (Ctrl-C's SIGINT may be ignored in a job)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 143, err
    assert b"keeps the 2 cells finished: add --resume" in err, err
    with pytest.raises(ProcessLookupError):  # the interrupted run ended the cell it was running
        for _ in range(50):
            os.kill(hang_pid, 0)
            time.sleep(0.1)
    recorded = [json.loads(x)["model"] for x in out.read_text().splitlines()]
    assert [m.rsplit(":", 1)[1] for m in recorded] == ["tiny", "tiny2"]

    # without --resume the file is not touched; with it, only hangs runs (given a short timeout)
    again = subprocess.run(command, capture_output=True, text=True)
    assert again.returncode == 2 and "--resume" in again.stderr
    before = len(_starts(log))
    resumed = subprocess.run([*command[:-2], "--timeout", "20", "--resume"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert _starts(log)[before:] == ["hangs"]
    assert "resuming" in resumed.stderr and "2 of 3 cells recorded, 1 to run" in resumed.stderr
    assert "[3/3]" in resumed.stderr and "timeout" in resumed.stdout
    cells = zoo.load_cells(str(out))
    assert sorted(c.label.split(" ")[0] for c in cells) == ["hangs", "tiny", "tiny2"]
    assert len(out.read_text().splitlines()) == 3


def test_model_entries_resolve_or_say_what_would(zoo, tmp_path):
    listing = tmp_path / "models.txt"
    (tmp_path / "m.py").write_text("def f():\n    pass\n")
    listing.write_text("# a comment\nllama, Qwen3ForCausalLM\nm.py:f  # beside the list\n")
    mine = f"{tmp_path.resolve() / 'm.py'}:f"
    assert zoo.resolve_models(["gemma3", f"@{listing}", "llama", mine]) == ["gemma3", "llama", "qwen3", mine]
    from edgeplug._errors import EdgeplugError

    with pytest.raises(EdgeplugError, match=r"unknown model 'lama' \(did you mean 'llama'\?\)"):
        zoo.resolve_models("lama")
    with pytest.raises(EdgeplugError, match="does not exist"):
        zoo.resolve_models(f"@{tmp_path / 'none.txt'}")
    with pytest.raises(EdgeplugError, match="expected FILE.py:FUNCTION"):
        zoo.resolve_models("m.txt:f")


def test_plan_makes_a_cell_per_declared_scheme_and_refuses_unknown_ones(zoo, fixture_site, fixture_backends):
    from edgeplug._errors import EdgeplugError

    fixture_site("good")  # tinycpu declares 8a8w, fixture-table no scheme
    cells, notes = zoo.plan("llama", "tinycpu,fixture-table", "float,8a8w")
    assert cells == [("llama", "tinycpu", "float"), ("llama", "tinycpu", "8a8w"), ("llama", "fixture-table", "float")]
    assert notes == ["fixture-table declares no 8a8w: those cells are not made"]
    with pytest.raises(EdgeplugError, match="scheme\\(s\\) w9 declared by none"):
        zoo.plan("llama", "tinycpu", "w9")
    with pytest.raises(EdgeplugError, match="tinycpi not installed"):
        zoo.plan("llama", "tinycpi")


def test_results_file_refuses_other_settings_and_skips_a_cut_line(zoo, tmp_path):
    from edgeplug._errors import EdgeplugError
    from edgeplug._zoo._run import Results, Settings

    out = tmp_path / "cells.jsonl"
    first = Results(str(out), resume=False, settings=Settings(layers=1))
    first.append(zoo.Cell(model="llama", backend="fixture-table"), Settings(layers=1))
    first.close()
    with out.open("a") as f:
        f.write('{"model": "qwen3", "backe')  # a writer killed mid-line
    again = Results(str(out), resume=True, settings=Settings(layers=1))
    assert list(again.recorded) == [("llama", "fixture-table", "float")]
    again.append(zoo.Cell(model="qwen3", backend="fixture-table"), Settings(layers=1))
    again.close()
    assert [c.model for c in zoo.load_cells(str(out))] == ["llama", "qwen3"]
    with pytest.raises(EdgeplugError, match="already holds results: pass --resume"):
        Results(str(out), resume=False, settings=Settings(layers=1))
    with pytest.raises(EdgeplugError, match=r"cells.jsonl:1 was recorded with .*'layers': 1.*resume with the same settings"):
        Results(str(out), resume=True, settings=Settings(layers=2))
