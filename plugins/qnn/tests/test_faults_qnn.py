"""Fault injection on qnn: an SoC executorch does not know is one line naming the partitioner factory and plugin.

Moved from the core's tests/test_faults.py (issue 23).
"""

from __future__ import annotations

from edgeplug.testing import assert_no_traceback, error_line


def test_qnn_with_an_unknown_soc_is_one_line_naming_the_factory_and_plugin(edgeplug_cli, edgeplug_plain_env, monkeypatch):
    # the real QNN plugin, no SDK (a dry run), and a SoC executorch does not know
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    monkeypatch.setenv("EDGEPLUG_QNN_SOC", "SM9999")
    code, stdout, stderr = edgeplug_cli("lower", "mlp", "-b", "qnn", "--dry-run", "-q")
    assert code == 2 and stdout == ""
    first = error_line(stderr)
    assert first.startswith("edgeplug: error: the partitioner factory (BackendSpec.partitioner) of backend 'qnn'")
    assert "plugin 'qnn'" in first and "edgeplug-qnn" in first
    assert "raised ValueError: EDGEPLUG_QNN_SOC=SM9999 names no Qualcomm SoC ExecuTorch knows" in first
    assert_no_traceback(stderr)
