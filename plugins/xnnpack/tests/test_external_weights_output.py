"""External weights follow lower's output rules (issue 37): the .pte and its .ptd are written together or not
at all. The .ptd's name is not the user's but derived from the .pte's, so nothing that is not this pair's is
replaced there: a folder, a symbolic link, a file that is not an ExecuTorch data file, or the data file of
another program (one with no .pte beside it) are refused, before any work on the command line and before
anything is written by ``LoweringResult.save``; so is a read-only folder. Replacing a .pte and the .ptd beside
it replaces the pair, as replacing a .pte does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

import edgeplug
from edgeplug import OutputPathError

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


class Tiny(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x):
        return self.fc(x).relu()


@pytest.fixture(scope="module")
def pairs():
    """Two lowerings with external weights, of two different models."""
    torch.manual_seed(0)
    out = []
    for width in (32, 48):
        result = edgeplug.lower(Tiny(width).eval(), (torch.randn(1, width),), "xnnpack", external_weights=True)
        assert result.data_buffer is not None
        out.append(result)
    return out


def _folder(path: Path) -> dict[str, bytes]:
    """Every entry of ``path`` (temporaries included) and its bytes (a link by where it points)."""
    return {
        p.name: (b"link:" + os.readlink(p).encode()) if p.is_symlink() else (b"dir" if p.is_dir() else p.read_bytes())
        for p in path.iterdir()
    }


def test_save_writes_the_pair_and_replaces_an_existing_pair_whole(pairs, tmp_path):
    first, second = pairs
    first.save(tmp_path / "m.pte")
    assert _folder(tmp_path) == {"m.pte": bytes(first.program.buffer), "m.ptd": first.data_buffer}
    second.save(tmp_path / "m.pte")  # another model's pair, replaced as a .pte is
    assert _folder(tmp_path) == {"m.pte": bytes(second.program.buffer), "m.ptd": second.data_buffer}


def _target(tmp_path: Path, kind: str, pairs) -> str:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if kind == "folder":
        (tmp_path / "m.ptd").mkdir()
    elif kind == "symlink":
        pairs[0].save(elsewhere / "other.pte")
        (tmp_path / "m.ptd").symlink_to(elsewhere / "other.ptd")
    elif kind == "unrelated file":
        (tmp_path / "m.ptd").write_text("my notes\n")
    elif kind == "another program's":
        pairs[0].save(elsewhere / "shared.pte")
        os.replace(elsewhere / "shared.ptd", tmp_path / "m.ptd")  # a .ptd with no m.pte beside it
    else:
        raise AssertionError(kind)
    return "m.pte"


KINDS = [
    ("folder", "cannot write the weights (.ptd) m.ptd: it is a folder, where the weights of m.pte go"),
    ("symlink", "cannot write the weights (.ptd) m.ptd: it is a symbolic link (to "),
    ("unrelated file", "cannot write the weights (.ptd) m.ptd: a file that is not an ExecuTorch data file is there"),
    ("another program's", "cannot write the weights (.ptd) m.ptd: it holds another program's weights (there is no m.pte"),
]


@pytest.mark.parametrize("kind, expect", KINDS)
def test_save_refuses_a_ptd_that_is_not_this_pairs_and_writes_nothing(pairs, tmp_path, monkeypatch, kind, expect):
    monkeypatch.chdir(tmp_path)
    target = _target(tmp_path, kind, pairs)
    before, written = _folder(tmp_path), pairs[1].report.output_path
    with pytest.raises(OutputPathError) as info:
        pairs[1].save(target, report="m.json")
    assert expect in str(info.value) and "give -o another name; nothing was written" in str(info.value)
    assert _folder(tmp_path) == before  # no .pte, no report, no temporary
    assert pairs[1].report.output_path == written  # the report does not claim a file was written


@pytest.mark.parametrize("kind, expect", KINDS)
def test_the_command_refuses_them_before_any_work(edgeplug_cli, pairs, tmp_path, monkeypatch, kind, expect):
    monkeypatch.chdir(tmp_path)
    target = _target(tmp_path, kind, pairs)
    before = _folder(tmp_path)
    code, stdout, stderr = edgeplug_cli("lower", "mlp", "-b", "xnnpack", "--external-weights", "-o", target)
    assert code == 2 and stdout == ""
    assert stderr.splitlines()[-1].startswith(f"edgeplug: error: {expect}"), stderr
    assert "[xnnpack] export" not in stderr  # refused before the model was even loaded
    assert _folder(tmp_path) == before


def test_a_stream_cannot_take_a_pair(edgeplug_cli, pairs, tmp_path):
    with pytest.raises(OutputPathError, match=r"two files \(.pte and .ptd\): give a file path"):
        pairs[0].save("-")
    code, stdout, stderr = edgeplug_cli("lower", "mlp", "-b", "xnnpack", "--external-weights", "-o", "-")
    assert code == 2 and stdout == "" and "two files (.pte and .ptd)" in stderr


def test_a_ptd_beside_a_pte_lowered_without_external_weights_is_not_touched(pairs, tmp_path):
    # the rules are for the pair: a program that keeps its weights writes its .pte alone
    (tmp_path / "m.ptd").write_text("not ours\n")
    plain = edgeplug.lower(Tiny(8).eval(), (torch.randn(1, 8),), "xnnpack")
    plain.save(tmp_path / "m.pte")
    assert (tmp_path / "m.ptd").read_text() == "not ours\n"


@pytest.fixture
def read_only(tmp_path):
    """A folder nothing can be written into: mode 0555, or for root (whom modes do not stop) the
    file system's immutable attribute."""
    folder = tmp_path / "ro"
    folder.mkdir()

    def lock() -> None:
        if os.geteuid() != 0:
            folder.chmod(0o555)
            return
        done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"root, and chattr +i does not work here ({done.stderr.strip()}): no folder is read-only to root")

    yield folder, lock
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
    folder.chmod(0o755)


def test_a_read_only_folder_keeps_its_pair_and_gets_no_temporary(edgeplug_cli, pairs, read_only, monkeypatch):
    folder, lock = read_only
    pairs[0].save(folder / "m.pte")
    lock()
    before = _folder(folder)
    with pytest.raises(OutputPathError, match="its folder is not writable"):
        pairs[1].save(folder / "m.pte")
    monkeypatch.chdir(folder)
    code, stdout, stderr = edgeplug_cli("lower", "mlp", "-b", "xnnpack", "--external-weights", "-o", "m.pte")
    assert code == 2 and stdout == ""
    assert stderr.splitlines()[-1].startswith("edgeplug: error: cannot write the .pte m.pte: its folder is not writable")
    assert _folder(folder) == before


def test_a_failing_rename_puts_back_what_the_pair_replaced(pairs, tmp_path):
    """write_files replaces the .pte, then the .ptd: where the second rename fails, the first is undone.
    (No public call reaches this window: the .ptd path turns into a folder while the files are written.)"""
    from edgeplug._outputs import write_files

    first, second = pairs
    first.save(tmp_path / "m.pte")
    before = _folder(tmp_path)

    class TurnsIntoAFolder:
        """The .ptd's bytes; writing them puts a folder (with a file in it) where the .ptd goes."""

        def write_to_file(self, f) -> None:
            f.write(second.data_buffer)
            (tmp_path / "m.ptd").unlink()
            (tmp_path / "m.ptd").mkdir()
            (tmp_path / "m.ptd" / "inside").write_text("x")

    with pytest.raises(OSError) as info:
        write_files({tmp_path / "m.pte": second.program, tmp_path / "m.ptd": TurnsIntoAFolder()})
    assert info.value.filename == os.fspath(tmp_path / "m.ptd")
    after = _folder(tmp_path)
    assert after.pop("m.ptd") == b"dir" and before.pop("m.ptd")
    assert after == before  # the first model's .pte is back, and no temporary is left


def test_two_writers_racing_on_one_pair_leave_one_writers_pair(pairs, tmp_path, monkeypatch):
    """Issue 47: two saves (two `edgeplug lower --external-weights -o m.pte`) racing left one's .pte beside the
    other's .ptd, which ExecuTorch refuses. Here the second writer runs between the first one's two renames;
    each rename set is locked, so the folder holds one writer's pair whole."""
    import threading

    first, second = pairs
    real, other_done, other = os.replace, threading.Event(), []

    def replace(src, dst, *a, **k):
        real(src, dst, *a, **k)
        if threading.current_thread() is threading.main_thread() and not other and os.fspath(dst).endswith("m.pte"):
            other.append(threading.Thread(target=lambda: (second.save(tmp_path / "m.pte"), other_done.set())))
            other[0].start()
            other_done.wait(1.0)  # unlocked, the other writer replaces its whole pair within this second

    monkeypatch.setattr(os, "replace", replace)
    first.save(tmp_path / "m.pte")
    other[0].join(60)
    assert other_done.is_set()
    pair = _folder(tmp_path)
    assert pair in (
        {"m.pte": bytes(first.program.buffer), "m.ptd": first.data_buffer},
        {"m.pte": bytes(second.program.buffer), "m.ptd": second.data_buffer},
    ), "a .pte beside another program's .ptd"
