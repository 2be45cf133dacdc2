"""Hostile inputs on vulkan (issue 28): int64 arithmetic its runtime computes in int32 fails verification,
such a result is not saved unless forced, and w4 on a linear of odd width is one error line.

Moved from the core's tests/test_hostile_inputs.py (issue 23).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import edgeplug

EDGEPLUG = [sys.executable, "-m", "edgeplug._cli"]


class Hash(torch.nn.Module):
    def forward(self, ids):
        return (ids * 1000003) // 4096


def _int64_case(backend: str):
    return edgeplug.lower(Hash(), (torch.tensor([[123456789, 987654321, 5000]]),), backend, verify=True)


@pytest.fixture(scope="module")
def int64_on_vulkan():
    return _int64_case("vulkan")


def test_int64_arithmetic_fails_on_vulkan_as_its_runtime_computes_int32(int64_on_vulkan):
    v = int64_on_vulkan.report.verification
    assert not v.passed
    # the value the Vulkan runtime gives (int32 wraps), not eager's 30140908049
    assert "int64 values differ (compared exactly); first at flat index 0: lowered -409071, eager 30140908049" in v.failures()[0]
    assert "2 eager values lie outside int32's range, which a delegate that holds int64 as int32 cannot" in v.failures()[0]
    assert "as the vulkan delegate holds values: int64 as int32" in v.note


def test_save_refuses_a_result_whose_verification_failed_unless_forced(int64_on_vulkan, tmp_path):
    result = int64_on_vulkan
    with pytest.raises(edgeplug.VerificationError, match="not saving .*verification failed .*force=True"):
        result.save(tmp_path / "m.pte")
    assert list(tmp_path.iterdir()) == []
    result.save(tmp_path / "m.pte", force=True)
    assert (tmp_path / "m.pte").read_bytes() == result.buffer


def test_w4_on_an_odd_linear_for_vulkan_is_one_error_line(tmp_path):
    (tmp_path / "odd.py").write_text(textwrap.dedent("""
        import torch
        class Odd(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(7, 3)
            def forward(self, x):
                return self.fc(x)
        def make():
            return Odd().eval(), (torch.randn(1, 7),)
    """))
    p = subprocess.run(
        [*EDGEPLUG, "lower", "odd.py:make", "-b", "vulkan", "--quantize", "w4", "-q"], capture_output=True, text=True,
        timeout=300, cwd=tmp_path,
    )
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("edgeplug: error: stage 'partition + delegate' failed") and len(p.stderr.splitlines()) == 1, p.stderr
