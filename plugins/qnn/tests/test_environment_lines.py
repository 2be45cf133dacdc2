"""qnn's environment variables, each wrong way a new user sets them: one line naming the variable and the fix,
before any work (issue 37). ``QNN_SDK_ROOT`` that does not exist or is a file, and ``EDGEPLUG_QNN_SAVER=1``
with no libraries; ``EDGEPLUG_QNN_SAVER=0`` is off (the device's SDK check speaks instead)."""

from __future__ import annotations

import pytest

from edgeplug.testing import assert_no_traceback

PREFIX = "edgeplug: error: backend 'qnn' cannot serialize its delegate here: "
DRY_RUN = "Use --dry-run (or lower(..., dry_run=True)) to partition and report without a .pte."


@pytest.mark.parametrize(
    "saver, root, reason, fix",
    [
        ("", "missing", "QNN_SDK_ROOT={root} does not exist", "set QNN_SDK_ROOT to its root"),
        ("", "file", "QNN_SDK_ROOT={root} is a file, not the SDK's folder", "set QNN_SDK_ROOT to its root"),
        ("1", None, "EDGEPLUG_QNN_SAVER is set but QNN_SDK_ROOT is not", "or unset EDGEPLUG_QNN_SAVER"),
        ("1", "missing", "EDGEPLUG_QNN_SAVER is set and QNN_SDK_ROOT={root} does not exist", "or unset EDGEPLUG_QNN_SAVER"),
        ("1", "empty", "QNN_SDK_ROOT={root} has no lib/x86_64-linux-clang/libQnnSaver.so", "or unset EDGEPLUG_QNN_SAVER"),
        ("0", None, "the QNN SDK is not configured (QNN_SDK_ROOT is not set)", "set QNN_SDK_ROOT to its root"),
    ],
)
def test_each_wrong_setting_is_one_line_naming_the_variable_and_the_fix(
    edgeplug_cli, edgeplug_plain_env, monkeypatch, tmp_path, saver, root, reason, fix
):
    monkeypatch.setenv("EDGEPLUG_QNN_SAVER", saver)
    path = {"missing": tmp_path / "no-sdk", "file": tmp_path / "sdk.zip", "empty": tmp_path}.get(root)
    if root == "file":
        path.write_bytes(b"PK")
    if path is None:
        monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    else:
        monkeypatch.setenv("QNN_SDK_ROOT", str(path))
    code, stdout, stderr = edgeplug_cli("lower", "mlp", "-b", "qnn")
    assert code == 2 and stdout == ""
    (line,) = stderr.splitlines()  # one line, and nothing before it: no work was done
    assert line.startswith(PREFIX + reason.format(root=path)), line
    assert fix in line and line.endswith(DRY_RUN)
    assert_no_traceback(stderr)
