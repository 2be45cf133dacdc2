"""These tests verify on edgeplug's host emulation: ExecuTorch's Vulkan runtime, where one is built here, is
turned off for the session (EDGEPLUG_VULKAN_RUNNER=off), before any fixture lowers. The modules that run
programs in it (plugins/vulkan/tests/test_real_runtime.py, test_runtime_gaps.py) use
``real_vulkan_runtime_env``, which gives back the variable as the shell set it (or unset)."""

from __future__ import annotations

import os

import pytest

VARIABLE = "EDGEPLUG_VULKAN_RUNNER"
_GIVEN = os.environ.get(VARIABLE)


@pytest.fixture(scope="session", autouse=True)
def _host_emulation():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(VARIABLE, "off")
        yield


@pytest.fixture(scope="module")
def real_vulkan_runtime_env():
    with pytest.MonkeyPatch.context() as mp:
        if _GIVEN is None:
            mp.delenv(VARIABLE, raising=False)
        else:
            mp.setenv(VARIABLE, _GIVEN)
        yield
