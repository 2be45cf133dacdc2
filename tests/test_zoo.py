"""The model zoo (``edgeplug._zoo``, ``edgeplug zoo``), on the core's fixture backends.

The full matrix (``make zoo``) writes docs/zoo.md. Here, with small models
written into the test's folder: ``run_cell`` for a backend that fuses RMSNorm
and verifies on host kernels, and for one whose partitioner is executorch's own
(so there is a stock flow beside edgeplug's), checks what the zoo claims (it
lowers, every norm is fused or recorded with a reason, the lowered program
computes what eager computes, edgeplug breaks the graph no more than stock
does); then the runs themselves, under both executors: each cell in its own
process, a killed worker retried then recorded, a hang recorded as a timeout, a
cell past its memory limit recorded as such, the same cells from local
processes and from Ray, and ``--resume`` after an interrupted run running only
the missing cells. Cell processes see installed distributions only: the
fixture backends reach them through ``EDGEPLUG_REGISTER_PLUGINS`` (and
``PYTHONPATH``). The Ray executor's run (about a minute) runs with
``EDGEPLUG_ZOO=1``. What the zoo says about one first-party backend (its target
line, its cells on the built-in decoders) is tested in plugins/<backend>/tests.
"""

from __future__ import annotations


import json
import os
from pathlib import Path

import pytest

import edgeplug
import edgeplug_fixture_backends as fb

#: the environment a cell's process needs to find the fixture backends (and nothing else: no entry point)
FIXTURE_ENV = {
    "EDGEPLUG_REGISTER_PLUGINS": fb.__name__,
    "EDGEPLUG_PLUGINS": "edgeplug-fixture-backends",  # the allow-list of installed plugins: none of them
}
FIXTURE_PATH = str(Path(fb.__file__).resolve().parent)

WHOLE_SET = os.environ.get("EDGEPLUG_ZOO") == "1"


def _fixture_env(env: dict) -> dict:
    """``env`` with the fixture backends registered in every process started with it."""
    path = os.pathsep.join(p for p in (FIXTURE_PATH, env.get("PYTHONPATH", "")) if p)
    return {**env, **FIXTURE_ENV, "PYTHONPATH": path}


#: a model with three RMSNorms (as transformers' decoders write them), adds and matmuls: what the zoo counts
NORMED = '''
import torch


class Norm(torch.nn.Module):
    def __init__(self, size):
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(size))

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


class Normed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norms = torch.nn.ModuleList([Norm(16) for _ in range(3)])
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x):
        h = x + self.down(torch.nn.functional.silu(self.up(self.norms[0](x))))
        h = h + self.down(torch.relu(self.up(self.norms[1](h))))
        return self.norms[2](h) @ self.up.weight.T


def normed():
    torch.manual_seed(0)
    return Normed().eval(), (torch.randn(2, 4, 16),)
'''


@pytest.fixture(scope="session")
def normed_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("zoo-normed") / "normed.py"
    path.write_text(NORMED)
    return f"{path}:normed"


@pytest.fixture(scope="session")
def cells(zoo, normed_model):
    """backend -> the normed model's Cell, lowered on first use (the fixture backends registered meanwhile)."""
    cache: dict = {}

    def get(backend: str):
        if backend not in cache:
            with fb.registered():
                cache[backend] = zoo.run_cell(normed_model, backend, warm=False)
        return cache[backend]

    return get


def _table(zoo, cell) -> str:
    return zoo.render_page([cell], "edgeplug zoo (test)", 1, 0.0)


def test_zoo_cell_fuses_every_norm_and_matches_eager(zoo, cells):
    cell = cells(fb.FUSED)
    table = _table(zoo, cell)
    assert not cell.error, table
    e = cell.edgeplug
    assert e.ok and e.partitions >= 1 and e.seconds > 0, table
    assert "SupportTablePartitioner, not an executorch partitioner: no stock flow" in cell.stock_absent
    # every norm of the program is fused (the policy takes a leaf weight of shape [D]) or has a record with a reason
    assert cell.norms_present == 3 and not cell.no_policy
    assert cell.norms_recorded == cell.norms_present, table
    assert cell.fusion_outcomes.get("rejected", 0) == len(cell.rejected) and all(r for _, r in cell.rejected), table
    assert cell.norms_fused == 3, table
    # numbers: the lowered program (the fused op on the backend's host kernel) against eager
    assert e.verify_error == "", table
    assert e.verify_method.startswith("kernels"), e.verify_method
    assert e.max_abs_diff is not None and e.max_abs_diff <= 1e-4, table
    assert e.verify_passed in (True, None), table  # None: a report without a verdict


def test_zoo_cell_beside_stock_breaks_the_graph_no_more(zoo, cells):
    cell = cells(fb.STOCK)  # executorch's demo partitioner: the stock flow is to_edge_transform_and_lower with it
    table = _table(zoo, cell)
    assert not cell.error and not cell.stock_absent, table
    e, s = cell.edgeplug, cell.stock
    assert e.ok and s.ok, table
    assert cell.no_policy and cell.fusion_outcomes == {}, table  # nothing fuses without a policy
    assert e.partitions <= s.partitions and e.cpu_nodes <= s.cpu_nodes, table
    assert e.seconds > 0 and s.seconds > 0 and e.pte_bytes and s.pte_bytes
    # verify_method "none": no runtime here, so nothing is run and the row says so instead of a failure
    assert e.verify_error == "" and e.verify_method == "none" and e.max_abs_diff is None, table
    assert "not run (no runtime for it here)" in table and "fails: VerificationError" not in table
    assert f"0 real lowerings could not verify ({fb.STOCK}: no runtime for its programs on this host, not run)" in table


def test_zoo_counts_cpu_nodes_like_the_report(cells):
    """Stock's CPU nodes are counted before to_executorch rewrites them, in the report's op spelling."""
    cell = cells(fb.STOCK)
    assert not cell.error and cell.stock.ok
    ops = set(cell.stock.cpu_ops)
    assert ops and all(op.count(".") >= 2 for op in ops), ops  # 'aten.mean.dim', never a pybind repr
    assert not any(op.startswith(("executorch_prim", "memory.")) or "alloc" in op for op in ops), ops
    assert set(cell.edgeplug.cpu_ops) <= ops | set(cell.edgeplug.cpu_reasons)


def test_zoo_failing_cell_is_a_row_not_a_crash(zoo, fixture_backends, monkeypatch):
    monkeypatch.setitem(zoo.MODELS, "broken", zoo.Arch("NoSuchConfig", "NoSuchModel"))
    cell = zoo.run_cell("broken", fixture_backends.TABLE, warm=False)
    assert cell.error.startswith("build/export: AttributeError"), cell.error
    doc = zoo.render_page([cell], "edgeplug zoo --models broken", 1, 0.0)
    assert "| broken | fixture-table | float | **fails**: build/export: AttributeError" in doc
    assert "edgeplug zoo --models broken" in doc


def test_zoo_stock_failure_is_shown_beside_edgeplug(zoo, cells, normed_model):
    cell = cells(fb.STOCK)

    class Boom:
        def __init__(self) -> None:
            raise RuntimeError("stock partitioner exploded\nsecond line")

    target = zoo.CellTarget(False, Boom)
    module, ep, inputs, _ = zoo.exported(normed_model)
    side = zoo.lower_stock(ep, inputs, [], target)
    assert not side.ok and side.error == "RuntimeError: stock partitioner exploded"
    cell = zoo.Cell.from_dict({**cell.to_dict(), "stock": zoo.Cell(model="", backend="", stock=side).to_dict()["stock"]})
    doc = zoo.render_page([cell], "cmd", 1, 0.0)
    assert "**fails**: RuntimeError: stock partitioner exploded" in doc
    assert "second line" not in doc


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

#: A cell that lowers spends about 8 s of CPU in its process (python and torch 1.5, the fixture backends and
#: executorch 3.5, a warm-up lowering 1, the lowering 1, host verification 1): 10 s of wall time on an idle
#: machine, 55 s on 2 cores shared with a test suite; a cell reaches its model after python and torch. So the
#: cells that end by themselves run first, under a timeout none of them comes near (``LONG``); then the hang,
#: beside killed_always, under a timeout of a fifth of tiny's wall time, at least SHORT_TIMEOUT: enough to
#: reach its model, and what it runs for.
LONG = 600
SHORT_TIMEOUT = 12
RUN_MEMORY = 3000  # MB
#: the two runs' cells, each run two at a time (the first run's timeout is LONG, the second's short)
FIRST_RUN = ("tiny", "killed_once", "greedy")
SECOND_RUN = ("hangs", "killed_always")


@pytest.fixture(scope="module")
def cell_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zoo-models")
    log = folder / "starts.log"
    (folder / "cells.py").write_text(CELL_MODELS.format(log=str(log)))
    return folder / "cells.py", log


def _starts(log) -> list[str]:
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


_second_timeout: dict = {}


def _run(zoo, cell_models, out, executor):
    """(cells by model, starts logged, the second run's timeout): the cells that end by themselves, then the
    hang and killed_always resumed into the same results file under a short timeout."""
    path, log = cell_models
    before = len(_starts(log))

    def run(names, timeout, resume):
        return zoo.run(
            [f"{path}:{f}" for f in names], [fb.FUSED], ["float"], jobs=2, executor=executor, layers=1,
            retries=1, timeout=timeout, memory_limit=RUN_MEMORY, out=str(out), resume=resume,
        )

    with pytest.MonkeyPatch.context() as mp:  # for this process's plan and every cell process it starts
        for name, value in _fixture_env(dict(os.environ)).items():
            mp.setenv(name, value)
        first = run(FIRST_RUN, LONG, False)
        [tiny] = [c for c in first if c.label.startswith("tiny")]
        # the first executor's run sets it, the other's reuses it: both give the same cells, details included
        timeout = _second_timeout.setdefault("s", max(SHORT_TIMEOUT, round(tiny.wall_seconds / 5)))
        second = run(SECOND_RUN, timeout, True)
    return {c.label.split(" ")[0]: c for c in [*first, *second]}, _starts(log)[before:], timeout


@pytest.fixture(scope="module")
def local_run(zoo, cell_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo-local") / "cells.jsonl"
    return (*_run(zoo, cell_models, out, "local"), out)


@pytest.fixture(scope="module")
def ray_run(zoo, cell_models, tmp_path_factory):
    if not WHOLE_SET:
        pytest.skip("the Ray executor's run takes about a minute: it runs with EDGEPLUG_ZOO=1 (`make zoo`); make test runs the local one")
    pytest.importorskip("ray", reason="ray is not installed (pip install 'edgeplug[ray]')")
    out = tmp_path_factory.mktemp("zoo-ray") / "cells.jsonl"
    return (*_run(zoo, cell_models, out, "ray"), out)


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", "ray"])
def test_a_killed_worker_is_retried_then_recorded(executor, request):
    cells, starts, _, _ = request.getfixturevalue(f"{executor}_run")
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
    cells, starts, timeout, out = request.getfixturevalue(f"{executor}_run")
    hang, hog = cells["hangs"], cells["greedy"]
    assert "hangs" in starts and "greedy" in starts  # each got as far as its own code
    assert hang.status == "timeout" and f"timeout of {timeout} s" in hang.detail, hang
    assert hang.wall_seconds >= timeout
    assert hog.status == "memory" and f"{RUN_MEMORY} MB" in hog.detail, hog
    # the runs went on: killed_always beside the hang was started again, tiny beside the hog lowered and verified
    assert cells["killed_always"].attempts == 2
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
    import signal
    import subprocess
    import sys
    import time

    path, log = tmp_path / "cells.py", tmp_path / "starts.log"  # this test's own log of starts
    path.write_text(CELL_MODELS.format(log=str(log)))
    out = tmp_path / "cells.jsonl"
    command = [sys.executable, "-m", "edgeplug._cli", "zoo", "--models", f"{path}:tiny,{path}:tiny2,{path}:hangs",
               "--backends", fb.TABLE, "--schemes", "float", "--jobs", "1", "--out", str(out), "--timeout", "300"]
    env = _fixture_env(dict(os.environ))
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
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
    again = subprocess.run(command, capture_output=True, text=True, env=env)
    assert again.returncode == 2 and "--resume" in again.stderr
    before = len(_starts(log))
    # the hang is reached before any backend loads (about 3 s: python and torch), so 10 s is enough to get there
    resumed = subprocess.run([*command[:-2], "--timeout", "10", "--resume"], capture_output=True, text=True, env=env)
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


def test_a_cells_sides_are_the_reports_partitionings(zoo, cells, normed_model, cli, tmp_path):
    """A side's partitions, CPU ops and reasons are the one ``Partitioning`` record's, edgeplug's report and
    stock's alike (what ``edgeplug lower --compare-stock`` reports), and a results line keeps them as they were."""
    cell = cells(fb.STOCK)
    with fb.registered():
        code, _, err = cli("lower", normed_model, "-b", fb.STOCK, "--compare-stock", "-q", "--report", tmp_path / "r.json")
    assert code == 0, err
    report = edgeplug.LoweringReport.model_validate_json((tmp_path / "r.json").read_text())
    assert report.stock is not None and not report.stock.error
    for side, partitioning, reasons in ((cell.edgeplug, report, True), (cell.stock, report.stock, False)):
        built = zoo.Side(ok=True)
        built.partitioned(partitioning, reasons=reasons)
        assert (built.partitions, built.cpu_ops, built.cpu_reasons) == (side.partitions, side.cpu_ops, side.cpu_reasons)
        assert built.cpu_nodes == partitioning.cpu_node_count == side.cpu_nodes
    assert zoo.comparable(zoo.Cell.from_dict(json.loads(json.dumps(cell.to_dict())))) == zoo.comparable(cell)
