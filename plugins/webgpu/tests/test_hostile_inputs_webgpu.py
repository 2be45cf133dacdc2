"""Hostile inputs on webgpu (issue 28): int64 arithmetic its runtime computes in int32 fails verification.

Moved from the core's tests/test_hostile_inputs.py (issue 23).
"""

from __future__ import annotations

import pytest
import torch

import edgeplug


class Hash(torch.nn.Module):
    def forward(self, ids):
        return (ids * 1000003) // 4096


def _int64_case(backend: str):
    return edgeplug.lower(Hash(), (torch.tensor([[123456789, 987654321, 5000]]),), backend, verify=True)


@pytest.mark.slow
def test_int64_arithmetic_fails_on_webgpu_too():
    v = _int64_case("webgpu").report.verification
    assert not v.passed and "lowered -409071, eager 30140908049" in v.failures()[0]
