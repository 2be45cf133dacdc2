"""The Vulkan plugin's GLSL (#version 450, through wgpu) et_vk.rms_norm on the wgpu adapter (llvmpipe in CI) against torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edgeplug.errors import KernelError
from edgeplug.runtime import get_device
from edgeplug_vulkan.kernels import check_rms_norm, glsl_source, prepare_rms_norm, rms_norm

WIDTHS = [1, 3, 4, 7, 64, 4096, 5000]


@pytest.fixture(scope="module")
def device():
    return get_device()


def _inputs(rows, width, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, width, generator=g) * 3).to(dtype)
    w = (1 + 0.5 * torch.randn(width, generator=g)).to(dtype)
    return x, w


@pytest.mark.parametrize("width", WIDTHS)
def test_matches_torch_rms_norm_fp32(width):
    x, w = _inputs(5, width)
    y = rms_norm(x, w, 1e-6)
    assert y.shape == x.shape and y.dtype == torch.float32
    torch.testing.assert_close(y, F.rms_norm(x, (width,), w, 1e-6), rtol=2e-6, atol=2e-6)


def test_fp16_is_refused_the_buffer_shader_stores_fp32():
    x, w = _inputs(2, 8, torch.float16)
    with pytest.raises(KernelError, match=r"vulkan et_vk.rms_norm.default: x has dtype float16; this kernel stores float32"):
        rms_norm(x, w, 1e-6)


@pytest.mark.parametrize("width", [1, 4])
def test_rows_past_the_1d_dispatch_limit_go_2d(device, width):
    rows = device.max_groups_per_dim + 1
    x, w = _inputs(rows, width)
    prepared = prepare_rms_norm(x, w, 1e-6)
    assert prepared.grid[1] == 2, prepared.grid
    prepared.run()
    y = prepared.result()
    torch.testing.assert_close(y, F.rms_norm(x, (width,), w, 1e-6), rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(y[-1], F.rms_norm(x[-1:], (width,), w, 1e-6)[0], rtol=2e-6, atol=2e-6)  # last row written


@pytest.mark.parametrize("wg", [1, 2, "subgroup"])
def test_workgroup_size_variants(device, wg):
    wg = device.subgroup_size if wg == "subgroup" else wg
    x, w = _inputs(3, 260)  # 65 vec4 per row: more than each size
    prepared = prepare_rms_norm(x, w, 1e-6, workgroup_size=wg)
    prepared.run()
    torch.testing.assert_close(prepared.result(), F.rms_norm(x, (260,), w, 1e-6), rtol=2e-6, atol=2e-6)
    assert prepared.workgroup_size == wg


def test_workgroup_is_one_subgroup(device):
    # wgpu compiles GLSL barrier() with subgroup scope: more invocations would race
    x, w = _inputs(2, 4096)
    assert prepare_rms_norm(x, w, 1e-6).workgroup_size == device.subgroup_size
    with pytest.raises(KernelError, match=r"workgroup_size \d+ exceeds \d+: .*barrier\(\) to a subgroup-scope barrier"):
        rms_norm(x, w, 1e-6, workgroup_size=device.subgroup_size * 2)


def test_glsl_450_source_with_vec4_and_scalar_variants():
    vec4, scalar = glsl_source(4, 64), glsl_source(1, 64)
    assert vec4.startswith("#version 450") and scalar.startswith("#version 450")
    assert "#define LANES 4" in vec4 and "#define LANES 1" in scalar
    assert "@compute" not in vec4  # wgpu would take it for WGSL


def test_runtime_weight_is_refused_naming_the_node():
    from edgeplug.runtime import OpCall

    call = OpCall(
        backend="vulkan", op="et_vk.rms_norm.default", node="et_vk_rms_norm_default",
        args=(torch.ones(2, 4), torch.ones(4), 1e-6), delegate="lowered_module_0", constants={}, sources={0: "x", 1: "mul_3"},
    )
    with pytest.raises(KernelError) as info:
        check_rms_norm(call)
    text = str(info.value)
    assert "'et_vk_rms_norm_default'" in text and "'lowered_module_0'" in text
    assert "'mul_3', which is not a constant" in text and "prepacks" in text
    ok = OpCall(**{**call.__dict__, "constants": {1: "blocks.0.attn_norm.weight"}})
    check_rms_norm(ok)  # a constant weight passes


def test_eps_defaults_to_float32_machine_epsilon():
    x = torch.full((2, 8), 1e-4)  # mean of squares 1e-8: eps decides the result
    w = torch.ones(8)
    y = rms_norm(x, w)  # no eps given
    eps = torch.finfo(torch.float32).eps
    torch.testing.assert_close(y, F.rms_norm(x, (8,), w, eps))
    assert not torch.allclose(y, F.rms_norm(x, (8,), w, 1e-6))


def test_leading_dims_and_non_contiguous_input():
    x = torch.randn(6, 2, 64).transpose(0, 1)  # (2, 6, 64), not contiguous
    w = torch.randn(64)
    y = rms_norm(x, w, 1e-6)
    assert y.shape == (2, 6, 64)
    torch.testing.assert_close(y, F.rms_norm(x, (64,), w, 1e-6), rtol=2e-6, atol=2e-6)


def test_zero_rows_return_empty():
    y = rms_norm(torch.empty(0, 16), torch.ones(16), 1e-6)
    assert y.shape == (0, 16)


BAD = [
    (lambda: rms_norm([1.0, 2.0], torch.ones(2)), "x must be a torch.Tensor, got list"),
    (lambda: rms_norm(torch.tensor(1.0), torch.ones(1)), "0-d tensor"),
    (lambda: rms_norm(torch.ones(3, 0), torch.ones(0)), "shape (3, 0)"),
    (lambda: rms_norm(torch.ones(2, 4, dtype=torch.bfloat16), torch.ones(4, dtype=torch.bfloat16)), "dtype bfloat16"),
    (lambda: rms_norm(torch.ones(2, 4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)), "dtype float64"),
    (lambda: rms_norm(torch.ones(2, 4, dtype=torch.int32), torch.ones(4, dtype=torch.int32)), "dtype int32"),
    (lambda: rms_norm(torch.ones(2, 4), None), "weight is None"),
    (lambda: rms_norm(torch.ones(2, 4), torch.ones(5)), "weight has shape (5,), but x's last dimension is 4"),
    (lambda: rms_norm(torch.ones(2, 4), torch.ones(1)), "weight has shape (1,)"),
    (lambda: rms_norm(torch.ones(2, 4), torch.ones(2, 4)), "weight has shape (2, 4)"),
    (lambda: rms_norm(torch.ones(2, 4), torch.ones(4, dtype=torch.float16)), "weight has dtype float16 but x has float32"),
    (lambda: rms_norm(torch.ones(2, 4), torch.ones(4), -1e-6), "eps is -1e-06"),
    (lambda: rms_norm(torch.ones(2, 4), torch.ones(4), float("nan")), "eps is nan"),
    (lambda: rms_norm(torch.ones(2, 4), torch.ones(4), float("inf")), "eps is inf"),
    (lambda: rms_norm(torch.ones(2, 4), torch.ones(4), "1e-6"), "eps must be a number, got str"),
    (lambda: rms_norm(torch.ones(2, 4), torch.ones(4), 1e-6, workgroup_size=48), "power of two"),
    (lambda: rms_norm(torch.ones(2, 4), torch.ones(4), 1e-6, workgroup_size=0), "power of two"),
    (lambda: rms_norm(torch.ones(2, 4), torch.ones(4), 1e-6, workgroup_size=1 << 20), "exceeds what"),
]


@pytest.mark.parametrize("call,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_fails_before_dispatch_naming_op_and_value(call, message):
    with pytest.raises(KernelError) as info:
        call()
    text = str(info.value)
    assert "vulkan et_vk.rms_norm.default" in text
    assert message in text


def test_input_larger_than_a_storage_binding_is_refused(device):
    width = 1024
    rows = device.max_binding_bytes // (4 * width) + 1
    if rows * width * 4 > 1 << 30:
        pytest.skip("the adapter binds more than 1 GiB; not allocated in a test")
    x = torch.empty(rows, width)  # never initialised: refused before upload
    with pytest.raises(KernelError, match=r"vulkan et_vk.rms_norm.default: x of shape .* binds at most"):
        rms_norm(x, torch.ones(width), 1e-6)
