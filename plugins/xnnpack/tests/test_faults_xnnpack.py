"""Fault injection on xnnpack: an op executorch's runtime has no kernel for is named as the runtime's refusal.

Moved from the core's tests/test_faults.py (issue 23). That a corrupted weight fails --verify is the
conformance suite's test_verification_fails_on_a_corrupted_weight (test_backend.py runs it for xnnpack).
"""

from __future__ import annotations

import pytest
import torch

import edgeplug


class _Sorts(torch.nn.Module):
    """aten::sort.values has no kernel in the runtime executorch's Python package links."""

    def forward(self, x):
        return torch.sort(x, dim=-1).values * 2


def test_a_kernel_the_runtime_lacks_is_named_as_the_runtimes_refusal():
    from edgeplug._errors import VerificationError

    with pytest.raises(VerificationError) as info:
        edgeplug.lower(_Sorts(), (torch.randn(3, 5),), "xnnpack", verify=True)
    msg = str(info.value)
    assert "executorch's runtime could not run the .pte" in msg and "0x14" in msg and "OperatorMissing" in msg
    assert "bug in edgeplug" not in msg
    assert getattr(info.value, "lowering_stage", None) == "verify"
    # the program itself lowers: only the runtime's check refused it
    assert edgeplug.lower(_Sorts(), (torch.randn(3, 5),), "xnnpack").report.cpu_ops == {"aten.sort.default": 1}
