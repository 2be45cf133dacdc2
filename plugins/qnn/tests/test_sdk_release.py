"""QNN libraries of a release ExecuTorch is not built against: the environment's fault, said so (issue 37).

ExecuTorch 1.5.1 is built against QNN 2.37; with the x86-64 libraries of the
onnxruntime-qnn wheel (QNN 2.47, 2.51) its adaptor loads them but cannot create
the HTP device. qnn's availability reads the libraries' release, so a real
lowering stops before any work with one line naming the library, its release,
the release expected and the commands that work, and a dry run partitions with
the support table (it needs no device). Where the release cannot be read, the
device's failure during partitioning is turned into the same kind of message.
The fake SDKs here are real shared libraries that load (a copy of one of
Python's own extension modules) carrying QNN's version text.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import _ctypes
import pytest

import edgeplug
from edgeplug.testing import assert_no_traceback, error_line
from edgeplug_qnn import support


def fake_sdk(root: Path, release: str) -> Path:
    """A QNN_SDK_ROOT whose libQnnHtp.so and libQnnSystem.so load and say they are QNN ``release``."""
    lib_dir = root / "lib" / "x86_64-linux-clang"
    lib_dir.mkdir(parents=True)
    for name in ("libQnnHtp.so", "libQnnSystem.so"):
        shutil.copyfile(_ctypes.__file__, lib_dir / name)
    with open(lib_dir / "libQnnHtp.so", "ab") as f:  # the loader reads the ELF headers, never the tail
        f.write(f"\0AISW_VERSION: {release}\0".encode())
    return root


@pytest.fixture
def newer_sdk(monkeypatch, tmp_path):
    monkeypatch.delenv("EDGEPLUG_QNN_SAVER", raising=False)
    monkeypatch.setenv("QNN_SDK_ROOT", str(fake_sdk(tmp_path / "sdk", "2.51.0")))
    return tmp_path / "sdk"


def test_executorch_names_the_release_it_is_built_against():
    assert support.executorch_release().startswith("1.5.")
    assert support.expected_qnn_release() == "2.37"


def test_libraries_of_another_release_make_qnn_unavailable_naming_both_releases(newer_sdk):
    a = edgeplug.get_backend("qnn").availability()
    assert not a.ok
    assert a.reason.startswith(f"QNN_SDK_ROOT={newer_sdk} holds QNN 2.51.0 (lib/x86_64-linux-clang/libQnnHtp.so), ")
    assert "ExecuTorch 1.5" in a.reason and "built against QNN 2.37: it cannot create the HTP device" in a.reason
    assert "The environment is at fault" in a.reason
    assert "Install the QNN 2.37 SDK" in a.hint
    assert "`EDGEPLUG_QNN_SAVER=1 edgeplug lower MODEL --backend qnn`" in a.hint and "--dry-run" in a.hint


def test_the_release_expected_is_not_refused(monkeypatch, tmp_path):
    # negative: the same check passes libraries of the release ExecuTorch is built against
    monkeypatch.delenv("EDGEPLUG_QNN_SAVER", raising=False)
    root = fake_sdk(tmp_path / "sdk", "2.37.1")
    monkeypatch.setenv("QNN_SDK_ROOT", str(root))
    assert support.qnn_release(root / "lib/x86_64-linux-clang/libQnnHtp.so") == "2.37.1"
    assert edgeplug.get_backend("qnn").availability().ok


def test_a_lowering_stops_before_any_work_blaming_the_environment(newer_sdk, edgeplug_cli):
    code, stdout, stderr = edgeplug_cli("lower", "mlp", "-b", "qnn")
    assert code == 2 and stdout == ""
    first = error_line(stderr)
    assert first.startswith("edgeplug: error: backend 'qnn' cannot serialize its delegate here: QNN_SDK_ROOT=")
    assert "holds QNN 2.51.0" in first and "built against QNN 2.37" in first and "EDGEPLUG_QNN_SAVER=1" in first
    assert "report it to ExecuTorch" not in stderr and "executorch's own" not in stderr
    assert "[qnn] export" not in stderr  # before any work
    assert_no_traceback(stderr)


def test_a_dry_run_needs_no_device(newer_sdk, edgeplug_cli):
    code, stdout, stderr = edgeplug_cli("lower", "mlp", "-b", "qnn", "--dry-run", "-q")
    assert code == 0, stderr
    assert "(dry run: nothing serialized)" in stdout and "QnnBackend" in stdout


def test_a_device_qnn_cannot_create_is_the_environments_fault(newer_sdk):
    from edgeplug import BackendUnavailableError

    with pytest.raises(BackendUnavailableError) as caught:
        with support.device_failure_named():
            try:  # what ExecuTorch's adaptor raises, chained as its partitioner raises it
                raise RuntimeError("Fail to configure Qnn device")
            except RuntimeError as exc:
                raise RuntimeError("Failed to initialize QNN backend for kHtpBackend. Ensure QNN SDK libraries are available") from exc
    message = str(caught.value)
    assert message.startswith(f"QNN could not create the HTP device with {newer_sdk}/lib/x86_64-linux-clang/libQnnHtp.so (QNN 2.51.0); ")
    assert "built against QNN 2.37" in message and "The environment is at fault" in message
    assert "EDGEPLUG_QNN_SAVER=1" in message and "--dry-run" in message
    # the core leaves such an error as the plugin said it (no plugin prefix, no "report it to")
    from edgeplug._failures import name_the_plugin

    assert name_the_plugin(caught.value, edgeplug.get_backend("qnn")) is caught.value
    assert str(caught.value) == message and caught.value.at_fault == "the environment"


def test_any_other_failure_is_left_as_it_is():
    with pytest.raises(ValueError, match="a bug somewhere else"):
        with support.device_failure_named():
            raise ValueError("a bug somewhere else")


@pytest.fixture(scope="module")
def real_libraries():
    """The QNN libraries of the onnxruntime-qnn wheel (QNN_SDK_ROOT laid out by .ci/qnn_saver.sh), else skip."""
    root = os.environ.get("QNN_SDK_ROOT")
    lib = Path(root or ".") / "lib" / "x86_64-linux-clang" / "libQnnHtp.so"
    if not root or not lib.is_file():
        pytest.skip("the QNN libraries are not laid out here (QNN_SDK_ROOT; .ci/qnn_saver.sh)")
    release = support.qnn_release(lib)
    if release is None or release.startswith("2.37."):
        pytest.skip(f"QNN_SDK_ROOT holds QNN {release}: not a release ExecuTorch cannot use")
    return Path(root), release


def _lower(root: Path, tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    lib_dir = root / "lib" / "x86_64-linux-clang"
    env = {k: v for k, v in os.environ.items() if k not in ("EDGEPLUG_QNN_SAVER", "EDGEPLUG_DEBUG")}
    env.update(QNN_SDK_ROOT=str(root), LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(lib_dir), os.environ.get("LD_LIBRARY_PATH")])))
    return subprocess.run(
        [sys.executable, "-m", "edgeplug._cli", "lower", "handwritten-llama-decoder", "--backend", "qnn", *argv],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env,
    )


def test_with_the_wheels_libraries_a_dry_run_lowers_and_a_real_lowering_says_what_works(real_libraries, tmp_path):
    root, release = real_libraries
    dry = _lower(root, tmp_path, "--dry-run", "-q")
    assert dry.returncode == 0, dry.stderr[-3000:]  # it failed at 'partition + delegate', blaming ExecuTorch
    real = _lower(root, tmp_path)
    assert real.returncode == 2
    assert real.stderr.splitlines() == [
        f"edgeplug: error: backend 'qnn' cannot serialize its delegate here: {support._wrong_release(str(root), release, '2.37')}. "
        f"{support._without_the_device('2.37')}. Use --dry-run (or lower(..., dry_run=True)) to partition and report without a .pte."
    ]
