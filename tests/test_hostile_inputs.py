"""Hostile inputs (issue 28): the mistakes a new user makes, one case a line where it can be.

Outputs that must never destroy another file, verification that follows the
delegate's dtypes and compares what the README says, budgets on folding and
calibration, and failures blamed on the right party. Most cases need no
lowering; the few that do share one small lowered program.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import edgeplug
from edgeplug._registry import lookup as plugins

EDGEPLUG = [sys.executable, "-m", "edgeplug._cli"]


#: the backend every case lowers to: fixture-keep, with the test scheme 8a8w (tests/fixtures/backends)
BACKEND = "fixture-keep"


@pytest.fixture(autouse=True)
def _clean(clean_plugin_env, monkeypatch, tmp_path):
    import edgeplug_fixture_quant

    monkeypatch.delenv("EDGEPLUG_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    plugins.reset()
    with edgeplug_fixture_quant.registered():
        yield


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


@pytest.fixture(scope="module")
def lowered():
    """One small program (verification passed) every output case saves."""
    import edgeplug_fixture_quant

    torch.manual_seed(0)
    with edgeplug_fixture_quant.registered():
        result = edgeplug.lower(Tiny().eval(), (torch.randn(1, 4),), "fixture-fused", verify=True)
    assert result.report.verification.passed
    return result


MODEL = """
import torch

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)

def make():
    return Tiny().eval(), (torch.randn(1, 4),)

def calibration():
    return [(torch.randn(1, 4),)]
"""


def _first(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if line.startswith("edgeplug: error:"))


# -- outputs: refused before any work -----------------------------------------------------


def _setup_target(tmp_path: Path, kind: str) -> str:
    model = tmp_path / "model.py"
    if kind == "model file":
        return "model.py"
    if kind == "symlink to the model file":
        (tmp_path / "link.pte").symlink_to(model)
        return "link.pte"
    if kind == "hard link to the model file":
        os.link(model, tmp_path / "hard.pte")
        return "hard.pte"
    if kind == "calibration file":
        return "calib.py"
    if kind == "symlink loop":
        (tmp_path / "a").symlink_to(tmp_path / "b")
        (tmp_path / "b").symlink_to(tmp_path / "a")
        return "a"
    if kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(tmp_path / "sock"))
        return "sock"
    if kind == "name too long":
        return "n" * 300 + ".pte"
    raise AssertionError(kind)


@pytest.mark.parametrize("which", ["-o", "--report"])
@pytest.mark.parametrize(
    "kind, expect",
    [
        ("model file", "would be written over the model file"),
        ("symlink to the model file", "would be written over the model file"),
        ("hard link to the model file", "would be written over the model file"),
        ("calibration file", "would be written over the calibration file"),
        ("symlink loop", "its symbolic links form a loop"),
        ("socket", "it is a socket, which edgeplug never replaces"),
        ("name too long", "its name is 304 bytes, longer than the 255 its folder allows"),
    ],
)
def test_an_output_that_must_not_be_written_is_refused_before_any_work(cli, tmp_path, which, kind, expect):
    (tmp_path / "model.py").write_text(MODEL)
    (tmp_path / "calib.py").write_text(MODEL)
    before = {p: p.read_bytes() for p in (tmp_path / "model.py", tmp_path / "calib.py")}
    target = _setup_target(tmp_path, kind)
    code, stdout, stderr = cli(
        "lower", "model.py:make", "-b", BACKEND, "--quantize", "8a8w", "--calibration", "calib.py:calibration",
        which, target,
    )
    assert code == 2 and stdout == ""
    assert expect in _first(stderr), stderr
    assert f"[{BACKEND}] export" not in stderr and "executing model.py" not in stderr  # before any work
    assert {p: p.read_bytes() for p in before} == before


@pytest.mark.parametrize("path", ["out/", "-"])
def test_a_folder_or_stdout_twice_is_refused_as_a_file_name(tmp_path, path):
    from edgeplug._errors import OutputPathError
    from edgeplug._outputs import check_output_paths

    if path == "out/":
        with pytest.raises(OutputPathError, match="the trailing slash names a folder"):
            check_output_paths({"the .pte": path})
    else:
        with pytest.raises(OutputPathError, match="the .pte and the report are the same file"):
            check_output_paths({"the .pte": "-", "the report": "-"})


# -- outputs: what is written, and how -----------------------------------------------------


def test_a_character_device_stays_one(lowered):
    before = os.stat("/dev/null")
    lowered.save("/dev/null")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


def test_a_fifo_is_streamed_into_not_replaced(lowered, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    lowered.save(fifo)
    reader.join(30)
    assert got == [lowered.buffer] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # no temporary, no renamed file


def test_dash_is_stdout(lowered, capfdbinary):
    lowered.save("-")
    assert capfdbinary.readouterr().out == lowered.buffer


def test_a_symlink_is_followed_and_stays_a_link(lowered, tmp_path):
    (tmp_path / "real.pte").write_bytes(b"old")
    (tmp_path / "link.pte").symlink_to(tmp_path / "real.pte")
    lowered.save(tmp_path / "link.pte")
    assert (tmp_path / "link.pte").is_symlink() and (tmp_path / "real.pte").read_bytes() == lowered.buffer


def test_a_name_of_250_bytes_is_written(lowered, tmp_path):
    target = tmp_path / ("n" * 246 + ".pte")
    lowered.save(target)
    assert target.read_bytes() == lowered.buffer and len(list(tmp_path.iterdir())) == 1


def test_a_trailing_slash_on_the_command_line_is_a_folder(cli, tmp_path):
    (tmp_path / "model.py").write_text(MODEL)
    code, _, stderr = cli("lower", "model.py:make", "-b", BACKEND, "-q", "-o", "outdir/", "--report", "rep/")
    assert code == 0, stderr
    assert sorted(p.name for p in (tmp_path / "outdir").iterdir()) == [f"model-{BACKEND}.pte"]
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == [f"model-{BACKEND}.json"]


# -- nothing unrunnable looks runnable (issue 37) --------------------------------------------


def test_a_dry_run_writes_no_pte_and_its_stand_in_only_when_asked(cli, tmp_path):
    (tmp_path / "model.py").write_text(MODEL)
    code, stdout, stderr = cli("lower", "model.py:make", "-b", BACKEND, "-q", "--dry-run", "-o", "m.pte", "--report", "r.json")
    assert code == 0, stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".pte") == []
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["dry_run"] is True and report["stand_in"]["kind"] == "dry run" and report["stand_in"]["written"] is None
    assert "--dry-run: m.pte was not written" in report["notes"] and "not runnable" not in stderr
    code, stdout, stderr = cli(
        "lower", "model.py:make", "-b", BACKEND, "-q", "--dry-run", "-o", "m.pte", "--report", "r.json", "--write-stand-in"
    )
    assert code == 0, stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".pte") == ["m.stand-in.pte"]  # never m.pte
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["stand_in"]["written"] == report["output_path"] == "m.stand-in.pte"
    assert "wrote the stand-in program m.stand-in.pte" in stdout
    assert [line for line in stderr.splitlines() if line.startswith("edgeplug:")] == [
        "edgeplug: not runnable: dry run: the delegate holds an empty stand-in payload (edgeplug compiled nothing), "
        "so this program does not run; wrote it as m.stand-in.pte"
    ]


def test_write_stand_in_to_stdout_is_refused_before_any_work(cli, tmp_path):
    (tmp_path / "model.py").write_text(MODEL)
    code, stdout, stderr = cli("lower", "model.py:make", "-b", BACKEND, "--dry-run", "-o", "-", "--write-stand-in")
    assert code == 2 and stdout == "" and f"[{BACKEND}] export" not in stderr
    assert _first(stderr) == "edgeplug: error: --write-stand-in writes STEM.stand-in.pte, a file: give -o FILE.pte, not -"


def test_save_writes_a_stand_in_program_only_when_asked_and_under_its_own_name(tmp_path):
    from edgeplug._errors import EdgeplugError

    model, args = Tiny().eval(), (torch.randn(1, 4),)
    dry = edgeplug.lower(model, args, BACKEND, dry_run=True)
    with pytest.raises(EdgeplugError, match="this was a dry run: there is no .pte to write .*keep_stand_in=True"):
        dry.save(tmp_path / "t.pte", stand_in=True)
    kept = edgeplug.lower(model, args, BACKEND, dry_run=True, keep_stand_in=True)
    assert kept.report.stand_in.kind == "dry run" and kept.report.dry_run
    with pytest.raises(EdgeplugError, match=r"not saving .*t\.pte: dry run: .* Pass stand_in=True .*t\.stand-in\.pte"):
        kept.save(tmp_path / "t.pte")
    with pytest.raises(EdgeplugError, match="not to '-'"):
        kept.save("-", stand_in=True)
    assert list(tmp_path.iterdir()) == []
    assert kept.save(tmp_path / "t.pte", stand_in=True) == tmp_path / "t.stand-in.pte"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.stand-in.pte"]
    real = edgeplug.lower(model, args, BACKEND)  # a program that runs: no stand-in, saved as asked
    assert real.report.stand_in is None and not real.report.dry_run
    assert real.save(tmp_path / "t.pte") == tmp_path / "t.pte"


# -- verification compares what the README says ---------------------------------------------


F16 = torch.float16


@pytest.mark.parametrize(
    "lowered_value, eager_value, problem",
    [
        (torch.tensor([2**53]), torch.tensor([2**53 + 1]), "1 of 1 int64 values differ (compared exactly)"),
        (torch.zeros(4, dtype=F16), torch.full((4,), 1e-3, dtype=F16), "max |difference| 1.000e-03 > tolerance 3.815e-06"),
        # a small value far off in an output whose magnitude is large: within 4 ulps at that magnitude
        (torch.tensor([0.045, 2.0], dtype=F16), torch.tensor([0.04, 2.0], dtype=F16), None),
        (torch.tensor([0.1, 2.0], dtype=F16), torch.tensor([0.04, 2.0], dtype=F16), "> tolerance 7.812e-03"),
        (torch.ones(2, dtype=torch.int32), torch.ones(2), "dtype int32 where eager gives float32"),
        (torch.ones(2), torch.ones(2, dtype=torch.float64), "dtype float32 where eager gives float64"),
        (torch.tensor([True]), torch.tensor([False]), "1 of 1 bool values differ"),
        (torch.tensor([float("nan")]), torch.tensor([1.0]), "1 NaN where eager has none"),
        (torch.full((2,), 1e-3, dtype=F16), torch.full((2,), 1e-3, dtype=F16), None),
        (torch.tensor([1000.0], dtype=F16), torch.tensor([1000.5], dtype=F16).nextafter(torch.tensor([2000.0], dtype=F16)), None),
        (torch.tensor([2**53 + 1]), torch.tensor([2**53 + 1]), None),
    ],
)
def test_outputs_compare_exactly_in_their_dtype_or_in_ulps_at_their_magnitude(lowered_value, eager_value, problem):
    from edgeplug._verify.compare import compare_output

    check = compare_output(0, lowered_value, eager_value)
    if problem is None:
        assert check.passed, check.problems
    else:
        assert not check.passed and problem in " | ".join(check.problems), check.problems


class Ramps(torch.nn.Module):
    """``layers`` layers that each add ``arange(n) * k``: constant-only, and large together."""

    def __init__(self, layers: int, n: int) -> None:
        super().__init__()
        self.layers, self.n = layers, n

    def forward(self, x):
        for k in range(self.layers):
            x = x + torch.arange(self.n, dtype=torch.float32) * float(k + 2)
        return x


def _folds(ep, **kw):
    from edgeplug._graph.fold import fold_constant_subgraphs

    records = fold_constant_subgraphs(ep, **kw)
    return [r for r in records if r.outcome != "refused"], [r for r in records if r.outcome == "refused"]


def test_forty_ramps_are_not_folded_past_the_programs_total_budget():
    ep = torch.export.export(Ramps(40, 512 * 512), (torch.randn(512 * 512),))
    made, refused = _folds(ep)
    assert made == [] and len(refused) == 80  # each mul and each arange, with why
    assert "over its total folding budget of 262,144 bytes" in refused[0].detail
    assert sum(t.numel() * t.element_size() for t in ep.constants.values()) < 1024


def test_the_total_budget_admits_folds_in_graph_order():
    ep = torch.export.export(Ramps(3, 25_000), (torch.randn(25_000),))  # 100,000 bytes a fold
    made, refused = _folds(ep, total_budget=250_000)
    assert [r.bytes_added for r in made] == [100_000, 100_000]
    assert [r.node for r in refused] == ["mul_2", "arange_2"]  # the third fold, then what it reads
    assert "would take the program's folded constants to 300,000 bytes, over its total" in refused[0].detail


@pytest.fixture(scope="module")
def quantized():
    """A generator that never ends, cut at 3 batches."""

    def forever():
        while True:
            yield (torch.randn(1, 4),)

    import edgeplug_fixture_quant

    with edgeplug_fixture_quant.registered():
        return edgeplug.quantize(Tiny().eval(), (torch.randn(1, 4),), BACKEND, "8a8w", forever(), calibration_batches=3)


def test_a_calibration_generator_that_never_ends_is_cut_and_counted(quantized):
    summary = quantized.quantization.summary()
    assert (summary.calibration_batches, summary.calibration_cut) == (3, True)
    assert "3 calibration batches, the first 3 of more (--calibration-batches)" in summary.table_lines()[0]


def test_a_calibration_file_that_never_ends_is_read_to_the_cap(tmp_path):
    from edgeplug._quantize.quantize import load_calibration

    (tmp_path / "c.py").write_text("import itertools, torch\ndata = ((torch.zeros(1),) for _ in itertools.count())\n")
    assert len(load_calibration("c.py:data", 5)) == 6  # one more than the cap: quantize says there were more


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["--calibration-batches", "0", "--quantize", "8a8w"], "'0': give at least 1"),
        (["--calibration-batches", "x", "--quantize", "8a8w"], "'x' is not a whole number"),
        (["--calibration-batches", "4"], "--calibration-batches needs --quantize SCHEME"),
    ],
)
def test_calibration_batches_flag(cli, argv, expect):
    code, _, stderr = cli("lower", "mlp", "-b", BACKEND, *argv)
    assert code == 2 and expect in stderr


def test_a_second_quantization_is_refused_up_front(quantized):
    from edgeplug._quantize.quantize import QuantizationError

    with pytest.raises(QuantizationError, match=rf"already quantized \(by {BACKEND}'s quantizer, scheme '8a8w'\)"):
        edgeplug.quantize(quantized, (torch.randn(1, 4),), BACKEND, "8a8w")


# -- the right party blamed -----------------------------------------------------------------


USER_MISTAKES = """
import dataclasses, torch
from {sibling} import Branchy

class Local(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1

@dataclasses.dataclass
class Out:
    y: torch.Tensor

class ReturnsOut(torch.nn.Module):
    def forward(self, x):
        return Out(x + 1)

class Train(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(3)

    def forward(self, x):
        return self.bn(x)

def branch():
    return Local(), (torch.randn(2, 3),)

def branch_in_sibling():
    return Branchy(), (torch.randn(2, 3),)

def dataclass_output():
    return ReturnsOut(), (torch.randn(2, 3),)

def train_mode():
    return Train(), (torch.randn(4, 3),)
"""

SIBLING = """
import torch

class Branchy(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1
"""


@pytest.mark.parametrize(
    "case, expect",
    [
        ("branch", "in the model: the model branches on a tensor's value at mistakes.py:7, in Local.forward (`if x.sum() > 0:`)"),
        ("branch_in_sibling", "the model branches on a tensor's value at {sibling}.py:6, in Branchy.forward"),
        ("dataclass_output", "in the model: the model returns a Out (defined at mistakes.py:11), a type torch.export cannot"),
        ("train_mode", "in the model: the model holds a BatchNorm in training mode at mistakes.py:25, in forward"),
    ],
)
def test_the_users_mistake_names_the_model_the_line_and_the_fix(cli, tmp_path, case, expect):
    sibling = f"sibling_{case}"  # a module name no other test imported
    (tmp_path / f"{sibling}.py").write_text(SIBLING)
    (tmp_path / "mistakes.py").write_text(USER_MISTAKES.format(sibling=sibling))
    code, stdout, stderr = cli("lower", f"mistakes.py:{case}", "-b", BACKEND, "-q")
    first = _first(stderr)
    assert code == 2 and expect.format(sibling=sibling) in first, first
    assert "Fix: " in first and "bug in edgeplug" not in first and "executorch's own" not in first
    fix = {"branch": "torch.where", "branch_in_sibling": "torch.cond", "dataclass_output": "register_dataclass(Out)",
           "train_mode": "call model.eval() before lowering"}[case]
    assert fix in first and len(stderr.strip().splitlines()) == 1


class NoDevice:
    """Backend "no-device" (fixture-keep's partitioner and delegate): its lowering context finds the vendor's
    libraries present but unable to make their device, as a plugin does that reads their release."""

    @edgeplug.hookimpl
    def edgeplug_backends(self):
        import edgeplug_fixture_backends as fb

        yield edgeplug.BackendSpec(
            backend="no-device", description="fixture-keep whose vendor libraries cannot make a device",
            backend_id=fb.BACKEND_IDS[fb.KEEP], partitioner=fb.keep_partitioner, lowering_context=self.device,
        )

    @staticmethod
    def device():
        from edgeplug import BackendUnavailableError

        raise BackendUnavailableError(
            "the vendor libraries under VENDOR_ROOT are release 9.1, the delegate is built against 9.0: they "
            "cannot make the device. Set VENDOR_ROOT to the 9.0 libraries, or lower with --dry-run"
        )


def test_a_present_sdk_that_cannot_make_its_device_is_the_environments_fault(cli, edgeplug_register, tmp_path):
    # the wrong party before: the plugin's file and line in front, as if the plugin had a bug
    (tmp_path / "model.py").write_text(MODEL)
    edgeplug_register(NoDevice(), name="no-device-plugin")
    code, stdout, stderr = cli("lower", "model.py:make", "-b", "no-device", "-q")
    assert code == 2 and stdout == ""
    assert stderr.splitlines() == [
        "edgeplug: error: stage 'to_edge': the vendor libraries under VENDOR_ROOT are release 9.1, the delegate is "
        "built against 9.0: they cannot make the device. Set VENDOR_ROOT to the 9.0 libraries, or lower with --dry-run"
    ]


# -- the environment: one line naming the variable and the fix (issue 37) ------------------------


@pytest.mark.parametrize(
    "entry, expect",
    [
        ("%%garbage", "EDGEPLUG_REGISTER_PLUGINS entry '%%garbage' is not MODULE or MODULE:OBJECT (dotted Python "
         "names, comma-separated): fix the variable"),
        ("no_such_module_37", "EDGEPLUG_REGISTER_PLUGINS names module 'no_such_module_37', which this Python cannot "
         "find (No module named 'no_such_module_37'): install it, or put the folder that holds it on PYTHONPATH"),
        ("edgeplug_fixture_backends:nothing_here", "EDGEPLUG_REGISTER_PLUGINS entry 'edgeplug_fixture_backends:nothing_here': "
         "module 'edgeplug_fixture_backends' has no attribute 'nothing_here': fix the OBJECT after the colon"),
    ],
)
def test_a_broken_register_plugins_entry_is_one_line_and_the_rest_lowers(tmp_path, entry, expect):
    # a process of its own, as a user's shell starts it: the fixture backends come from the variable too
    import edgeplug_fixture_backends

    (tmp_path / "model.py").write_text(MODEL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEPLUG_")}
    env["EDGEPLUG_REGISTER_PLUGINS"] = f"edgeplug_fixture_backends,{entry}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(edgeplug_fixture_backends.__file__).parent), env.get("PYTHONPATH")]))
    p = subprocess.run([*EDGEPLUG, "lower", "model.py:make", "-b", BACKEND, "-q", "-o", "m.pte"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    (line,) = p.stderr.splitlines()  # the one line, not a Python warning with its source line
    assert line.startswith(f"edgeplug: warning: plugin {entry!r} (named in EDGEPLUG_REGISTER_PLUGINS) failed at import: {expect}"), line
    assert (tmp_path / "m.pte").is_file()  # the other plugins still work


@pytest.mark.parametrize(
    "stdout, code, stderr",
    [("closed pipe", 141, ""), ("/dev/full", 74, "edgeplug: output failed: No space left on device\n")],
)
def test_stdout_that_fails_is_the_environments_and_ends_quietly(stdout, code, stderr):
    if stdout == "closed pipe":
        read, target = os.pipe()
        os.close(read)
    else:
        target = os.open("/dev/full", os.O_WRONLY)
    try:
        p = subprocess.run([*EDGEPLUG, "examples"], stdout=target, stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(target)
    assert (p.returncode, p.stderr.decode()) == (code, stderr)
