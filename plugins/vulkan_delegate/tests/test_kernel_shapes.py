"""Both GPU rms_norm kernels (WGSL for webgpu, GLSL compiled to SPIR-V for vulkan) on every workgroup path.

The shared kernel suite checks the default shape; these tests force the other
paths of the shaders on the adapter (llvmpipe in CI, 8-wide subgroups): rows
spanning several subgroups (then one barrier), several rows per subgroup
(shuffles confined to the row), several rows per workgroup with the last
workgroup partly past the end, the shared-memory tree used where an adapter
has no subgroups, rows read twice (nothing kept in registers), rows longer
than the registers hold, and registers loaded straight (few units) or behind
branches (more). Each is compared with a float64 reference, in fp32
and fp16, after zeroing y so an unwritten element cannot pass.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from edgeplug.plugin import KernelError
from edgeplug.plugin import gpu_device
from edgeplug_vulkan_delegate.kernel_contract import MAX_ITEMS, STRAIGHT_LOADS_MAX_ITEMS, WorkgroupShape, choose_shape

KERNELS = {
    "webgpu": importlib.import_module("edgeplug_webgpu.kernels.rms_norm"),
    "vulkan": importlib.import_module("edgeplug_vulkan.kernels.rms_norm"),
}
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3}


@pytest.fixture(scope="module")
def device():
    return gpu_device()


def reference(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def run_zeroed(prepared) -> torch.Tensor:
    prepared.device.clear(prepared.out)  # an element the shader skips reads 0, not a stale result
    prepared.run()
    return prepared.result()


def assert_matches(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> None:
    ref = reference(x, w, eps)
    err = ((y.double() - ref).abs() / (1 + ref.abs())).max().item()
    assert err < TOLERANCE[x.dtype], f"max relative error {err:.2e}"


def inputs(rows: int, width: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)  # fresh values per case
    x = (torch.randn(rows, width, generator=g) * 3).to(dtype)
    w = (1 + 0.5 * torch.randn(width, generator=g)).to(dtype)
    return x, w


def shapes(sg: int):
    """(id, rows, width, prepare kwargs) covering each path; ``sg`` is the adapter's subgroup size."""
    return [
        ("row spans 4 subgroups", 5, 4 * sg * 4 * 3, dict(workgroup_size=4 * sg, items=3)),
        ("row spans 2 subgroups, 2 rows per workgroup", 7, 2 * sg * 4 * 2, dict(workgroup_size=4 * sg, rows_per_workgroup=2, items=2)),
        ("4 rows per subgroup, last workgroup partial", 13, 36, dict(workgroup_size=sg, rows_per_workgroup=4)),
        ("guarded loads, 2 rows per workgroup, last workgroup partial", 5, 4 * sg * 7 + 12,
         dict(workgroup_size=2 * sg, rows_per_workgroup=2, items=STRAIGHT_LOADS_MAX_ITEMS + 3)),
        ("straight loads, last workgroup partial, row shorter than the registers", 5, 4 * sg * 3 + 4,
         dict(workgroup_size=2 * sg, rows_per_workgroup=2, items=STRAIGHT_LOADS_MAX_ITEMS)),
        ("one invocation per row", 9, 20, dict(workgroup_size=8, rows_per_workgroup=8)),
        ("shared-memory tree", 6, 1000, dict(workgroup_size=4 * sg, subgroups=False)),
        ("shared-memory tree, 2 rows per workgroup", 5, 260, dict(workgroup_size=2 * sg, rows_per_workgroup=2, subgroups=False)),
        ("read twice, nothing in registers", 4, 5000, dict(workgroup_size=2 * sg, items=0)),
        ("row longer than the registers", 3, 4 * 16 * MAX_ITEMS + 40, dict(workgroup_size=16, items=MAX_ITEMS)),
        ("more registers than the row needs", 3, 12, dict(workgroup_size=4, items=5)),
        ("odd width, padded to whole units", 6, 333, {}),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("backend", sorted(KERNELS))
def test_every_workgroup_path_matches_the_float64_reference(device, backend, dtype):
    if device.subgroup_size is None:
        pytest.skip(f"{device.summary} has no subgroups")
    kernel = KERNELS[backend]
    failures = []
    for n, (what, rows, width, kw) in enumerate(shapes(device.subgroup_size)):
        if kw.get("workgroup_size", 1) > device.max_workgroup_size:
            continue
        x, w = inputs(rows, width, dtype, seed=n)
        prepared = kernel.prepare(x, w, 1e-6, **kw)
        try:
            assert_matches(run_zeroed(prepared), x, w)
        except AssertionError as exc:
            failures.append(f"{what} ({prepared.layout.tag()}): {exc}")
    assert not failures, failures


def test_rows_past_the_1d_dispatch_limit_go_to_y(device):
    # one row per workgroup and one more row than a dimension holds: the last row is in wid.y
    rows = device.max_groups_per_dim + 1
    x, w = inputs(rows, 4, torch.float32, seed=1)
    for kernel in KERNELS.values():
        prepared = kernel.prepare(x, w, 1e-6, workgroup_size=1)
        assert prepared.grid[1] == 2, prepared.grid
        y = run_zeroed(prepared)
        assert_matches(y[-3:], x[-3:], w)  # the rows dispatched in the second y row


def test_the_default_shape_is_the_same_for_both_kernels(device):
    x, w = inputs(64, 4096, torch.float32, seed=2)
    a = KERNELS["webgpu"].prepare(x, w, 1e-6).layout
    b = KERNELS["vulkan"].prepare(x, w, 1e-6).layout
    assert a == b


class GpuLike:
    """What choose_shape reads off a device, for an H200-like discrete GPU (32-wide subgroups)."""

    summary, adapter_type, subgroup_size, max_workgroup_size = "a discrete GPU", "DiscreteGPU", 32, 1024
    limits = {"max-compute-workgroup-storage-size": 32768}


@pytest.mark.parametrize(
    "units, expected",
    [
        (1024, WorkgroupShape(256, 256, 4, True)),  # 4096 fp32: 256 invocations, 4 units each
        (2048, WorkgroupShape(512, 512, 4, True)),  # 8192 fp32
        (1250, WorkgroupShape(256, 256, 5, True)),  # 5000 fp32
        (512, WorkgroupShape(128, 128, 4, True)),  # 4096 fp16
        (256, WorkgroupShape(128, 64, 4, True)),  # 1024 fp32: two rows per workgroup
        (1, WorkgroupShape(128, 1, 1, True)),  # tiny rows: 128 per workgroup
    ],
)
def test_default_shapes_on_a_gpu(units, expected):
    assert choose_shape(GpuLike(), units, where="test") == expected


def test_fp16_rows_get_the_fp32_rule_and_few_units_load_straight():
    # 8192 halves = 1024 units: 256 invocations x 4 units, as for 4096 floats
    shape = choose_shape(GpuLike(), 1024, where="test")
    assert shape == WorkgroupShape(256, 256, 4, True) and shape.straight_loads
    assert not WorkgroupShape(128, 128, STRAIGHT_LOADS_MAX_ITEMS + 1, True).straight_loads
    assert not WorkgroupShape(128, 128, 0, True).straight_loads  # nothing in registers: nothing to load early


def test_cpu_adapters_get_one_subgroup_per_workgroup(device):
    if device.adapter_type != "CPU" or not device.subgroup_size:
        pytest.skip("llvmpipe-specific default")
    shape = choose_shape(device, 1250, where="test")
    assert shape.invocations == device.subgroup_size


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(workgroup_size=48), "workgroup_size must be a power of two"),
        (dict(workgroup_size=8, rows_per_workgroup=16), "rows_per_workgroup 16 exceeds workgroup_size 8"),
        (dict(rows_per_workgroup=3), "rows_per_workgroup must be a power of two"),
        (dict(items=MAX_ITEMS + 1), f"items must be an int in 0..{MAX_ITEMS}"),
        (dict(workgroup_size=1 << 20), "exceeds what"),
    ],
)
@pytest.mark.parametrize("backend", sorted(KERNELS))
def test_bad_shapes_are_refused_naming_the_kernel(backend, kw, message):
    x, w = inputs(2, 8, torch.float32, seed=3)
    with pytest.raises(KernelError) as info:
        KERNELS[backend].rms_norm(x, w, 1e-6, **kw)
    assert f"{backend} et_vk.rms_norm.default" in str(info.value) and message in str(info.value)
