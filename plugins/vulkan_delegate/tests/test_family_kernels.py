"""The family's kernels: registered through each plugin's hook, run without executorch, shaped by the contract."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import pytest
import torch

import edgeplug
from edgeplug.plugin import KernelError, gpu_device

OP = "et_vk.rms_norm.default"


def test_a_disabled_adapter_fails_the_kernels_with_a_clear_message(monkeypatch):
    from edgeplug_webgpu.kernels import rms_norm

    monkeypatch.setenv("EDGEPLUG_WGPU_ADAPTER", "none")
    with pytest.raises(KernelError, match="disabled by EDGEPLUG_WGPU_ADAPTER=none"):
        rms_norm(torch.ones(2, 4), torch.ones(4))


@pytest.mark.parametrize("backend", ["webgpu", "vulkan"])
def test_kernels_are_registered_through_the_hook(backend):
    b = edgeplug.get_backend(backend)
    k = b.kernel(OP)
    assert k is not None and k.device == "wgpu" and k.checks is not None
    own = importlib.import_module(f"edgeplug_{backend}.kernels.rms_norm")
    assert k.impl == own.rms_norm and k.impl.__self__.pipeline is own.pipeline  # the plugin's own shader
    assert b.origin(k).distribution == f"edgeplug-{backend}"
    y = k.impl(torch.ones(2, 4), torch.full((4,), 2.0), 0.0)
    torch.testing.assert_close(y, torch.full((2, 4), 2.0))


def test_kernels_run_without_executorch():
    # the benchmark runs where executorch is absent: block it and use both kernels
    code = textwrap.dedent(
        """
        import sys
        sys.modules["executorch"] = None  # any import of executorch now fails
        import torch, torch.nn.functional as F
        from edgeplug_webgpu.kernels import rms_norm as wgsl
        from edgeplug_vulkan.kernels import rms_norm as glsl
        x, w = torch.randn(3, 8), torch.randn(8)
        for f in (wgsl, glsl):
            torch.testing.assert_close(f(x, w, 1e-6), F.rms_norm(x, (8,), w, 1e-6))
        assert not any(m.startswith("executorch.") for m in sys.modules)
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")


def test_an_explicit_workgroup_shape_is_kept_and_a_bad_one_refused():
    from edgeplug_vulkan_delegate.kernel_contract import choose_shape

    dev = gpu_device()
    shape = choose_shape(dev, 16, where="t", workgroup_size=32)
    assert (shape.invocations, shape.row_invocations, shape.rows) == (32, 32, 1)  # workgroup_size alone: one row each
    with pytest.raises(KernelError, match="t: workgroup_size must be a power of two >= 1, got 48"):
        choose_shape(dev, 16, where="t", workgroup_size=48)
    with pytest.raises(KernelError, match=r"t: workgroup_size \d+ exceeds what .* allows"):
        choose_shape(dev, 16, where="t", workgroup_size=1 << 20)
    with pytest.raises(KernelError, match="t: rows_per_workgroup 64 exceeds workgroup_size 32"):
        choose_shape(dev, 16, where="t", workgroup_size=32, rows_per_workgroup=64)
