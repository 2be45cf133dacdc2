"""A calibration file is user code, run as a model file is (issue 47): its prints stay off a .pte streamed
to stdout, a change of folder is undone (``-o rel.pte`` lands where the command ran, not in ``/``), and
calibration inputs holding NaN are refused naming the batch and input, not blamed on the quantizer."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CALIBRATION = (
    "import os, torch\n"
    "print('calibration file says hello')\n"
    "os.chdir('/')\n"
    "def batches():\n"
    "    bad = torch.randn(2, 32)\n"
    "    bad[0, 3] = {value}\n"
    "    return [(torch.randn(2, 32),), (bad,)]\n"
)


@pytest.fixture(autouse=True)
def _plain(edgeplug_plain_env, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)


def _calibration(tmp_path, value: str = "0.5"):
    (tmp_path / "calib.py").write_text(CALIBRATION.format(value=value))
    return f"{tmp_path / 'calib.py'}:batches"


def test_a_calibration_file_changing_folder_leaves_the_outputs_where_they_were_asked(cli, tmp_path):
    name = f"rel-{tmp_path.name}.pte"  # a name no earlier run left in /
    code, stdout, stderr = cli("lower", "mlp", "-b", "xnnpack", "--quantize", "8a8w", "--calibration", _calibration(tmp_path),
                               "-q", "-o", name)
    assert code == 0, stderr
    assert os.getcwd() == str(tmp_path) and (tmp_path / name).is_file() and not os.path.exists(f"/{name}")
    assert any(x.startswith("edgeplug: warning: the calibration file changed the working folder to /") for x in stderr.splitlines())
    assert "calibration file says hello" not in stdout + stderr  # held off the terminal without -v


def test_calibration_prints_stay_out_of_a_pte_on_stdout(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "edgeplug._cli", "lower", "mlp", "-b", "xnnpack", "--quantize", "8a8w",
         "--calibration", _calibration(tmp_path), "-q", "-o", "-"],
        capture_output=True, cwd=tmp_path, timeout=600,
    )
    assert p.returncode == 0, p.stderr.decode()
    assert b"hello" not in p.stdout and p.stdout[4:8] == b"ET12"


@pytest.mark.parametrize("value", ["float('nan')", "float('inf')"])
def test_non_finite_calibration_inputs_are_refused_naming_the_batch(cli, tmp_path, value):
    code, _, stderr = cli("lower", "mlp", "-b", "xnnpack", "--quantize", "8a8w", "--calibration",
                          _calibration(tmp_path, value), "-q", "-o", "m.pte")
    assert code == 2
    line = next(x for x in stderr.splitlines() if x.startswith("edgeplug: error:"))
    assert "calibration batch 1, input 0 (shape (2, 32))" in line and "must be finite" in line
    assert "The data is at fault, not the quantizer" in line
    assert not (tmp_path / "m.pte").exists()
