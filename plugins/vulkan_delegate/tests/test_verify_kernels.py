"""Host verification of vulkan/webgpu lowerings: delegate ops run with the plugins' kernels on the adapter.

The models call ``et_vk.rms_norm`` directly, so the delegate's partition holds
the fused op whether or not the core's fusion produced it.
"""

from __future__ import annotations

import re

import pytest
import torch

import edgeplug
from edgeplug import KernelError, VerificationError
from edgeplug.plugin import gpu_device

#: the variable that picks the wgpu adapter (README); the process's device is cached per value
ADAPTER_ENV = "EDGEPLUG_WGPU_ADAPTER"

WIDTH = 64


class ConstantWeight(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(1 + 0.1 * torch.randn(WIDTH, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        return torch.ops.et_vk.rms_norm(x * 2, self.w, 1e-6)


class RuntimeWeight(torch.nn.Module):
    def forward(self, x, w):
        return torch.ops.et_vk.rms_norm(x, w, 1e-6) + 1


class BothWeights(ConstantWeight):
    def forward(self, x, w):
        return super().forward(x) + torch.ops.et_vk.rms_norm(x, w, 1e-6)


def _x():
    return torch.randn(2, 5, WIDTH, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def lowered():
    import executorch.backends.vulkan.custom_ops_lib  # noqa: F401  registers the et_vk ops

    cache = {}

    def get(model: str, backend: str):
        if (model, backend) not in cache:
            m = {"constant": ConstantWeight, "runtime": RuntimeWeight, "both": BothWeights}[model]().eval()
            inputs = (_x(),) if model == "constant" else (_x(), torch.randn(WIDTH))
            cache[model, backend] = edgeplug.lower(m, inputs, backend)
        return cache[model, backend]

    return get


def _weight_entry(result):
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    (_, lowered, _), = get_lowered_submodules(result.edge.exported_program().graph_module)
    data = lowered.named_data_store_output
    (key,) = [k for k, e in data.pte_data.items() if len(data.buffers[e.buffer_index]) == 4 * WIDTH]
    return data, key


@pytest.fixture
def no_adapter(monkeypatch):
    monkeypatch.setenv(ADAPTER_ENV, "none")
    yield
    monkeypatch.undo()


@pytest.mark.parametrize("backend,model,count", [("vulkan", "constant", 1), ("webgpu", "both", 2)])
def test_fused_op_runs_with_the_plugin_kernel_on_the_adapter(lowered, backend, model, count):
    v = edgeplug.verify(lowered(model, backend), backend)
    assert v.method == "kernels"
    assert v.adapter == gpu_device().summary
    assert v.max_abs_diff < 1e-5
    assert f"{backend} kernels ran et_vk.rms_norm.default x{count} on the adapter" in v.note
    assert "aten.mul.Tensor x1" in v.note  # the rest of the delegate ran with torch
    assert "constants read from named data" in v.note


def test_the_weight_is_read_through_the_named_data(lowered, monkeypatch):
    result = lowered("both", "webgpu")
    data, key = _weight_entry(result)
    entry = data.pte_data[key]
    original = data.buffers[entry.buffer_index]
    data.buffers[entry.buffer_index] = bytes(len(original))  # what the .pte would carry: zeros
    # the device caches constants by key: naming the same adapter by its full summary opens a device of its own
    monkeypatch.setenv(ADAPTER_ENV, gpu_device().summary)
    try:
        v = edgeplug.verify(result, "webgpu")
    finally:
        data.buffers[entry.buffer_index] = original
        monkeypatch.delenv(ADAPTER_ENV)
    assert v.max_abs_diff > 0.5  # zeros in the .pte show up as a mismatch against eager
    assert edgeplug.verify(result, "webgpu").max_abs_diff < 1e-5  # restored


def test_a_weight_missing_from_the_named_data_fails_loud(lowered):
    result = lowered("constant", "vulkan")
    data, key = _weight_entry(result)
    entry = data.pte_data.pop(key)
    try:
        with pytest.raises(VerificationError) as info:
            edgeplug.verify(result, "vulkan")
    finally:
        data.pte_data[key] = entry
    text = str(info.value)
    assert "constant 'p_w'" in text and "not in the delegate's named data" in text and "lowered_module_0" in text


def test_vulkan_refuses_a_runtime_weight_naming_the_node(lowered):
    with pytest.raises(KernelError) as info:
        edgeplug.verify(lowered("runtime", "vulkan"), "vulkan")
    text = str(info.value)
    assert "node 'et_vk_rms_norm_default'" in text and "the weight comes from 'w', which is not a constant" in text
    assert "While executing" not in text  # no fx noise


def test_without_an_adapter_verification_falls_back_to_reference_kernels(lowered, no_adapter):
    v = edgeplug.verify(lowered("both", "webgpu"), "webgpu")
    assert v.adapter.startswith("none (") and ADAPTER_ENV in v.adapter
    assert "et_vk.rms_norm.default x2 ran with torch reference kernels instead" in v.note
    assert v.max_abs_diff < 1e-5
    with pytest.raises(KernelError, match="not a constant"):  # the runtime's contract holds regardless
        edgeplug.verify(lowered("runtime", "vulkan"), "vulkan")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["webgpu", "vulkan"])
def test_cli_verifies_llama_on_the_adapter(edgeplug_cli, tmp_path, backend):
    code, out, err = edgeplug_cli("lower", "handwritten-llama-decoder", "--backend", backend, "--verify", "-q", "-o", tmp_path / "llama.pte")
    assert code == 0, err
    assert f"verification (kernels on {gpu_device().summary})" in out
    diff = float(re.search(r"max \|difference\| vs eager = (\S+)", out).group(1))
    assert diff < 1e-4
    # the core fuses the model's five RMSNorms into et_vk.rms_norm; each ran on the adapter
    assert f"{backend} kernels ran et_vk.rms_norm.default x5 on the adapter" in out
    if backend == "vulkan":  # the GLSL kernel reached wgpu as glslang's SPIR-V, never as GLSL text
        modules = [m for m in gpu_device().shader_modules if m.label.startswith("vulkan rms_norm")]
        assert modules and {m.language for m in modules} == {"spirv"}


def test_when_no_delegate_op_has_a_kernel_the_headline_names_torch_not_the_adapter(edgeplug_cli, tmp_path):
    """Issue 47: an mlp's delegate ops (linear, relu) have no vulkan kernel, so nothing runs on the adapter; the
    headline said 'kernels on <the adapter>' all the same."""
    import edgeplug

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    v = edgeplug.lower(model, (torch.randn(2, 8),), "vulkan", verify=True).report.verification
    assert v.passed and "no delegate op has a vulkan kernel, nothing ran on the adapter" in v.note
    assert v.adapter.startswith("the host CPU with torch (no delegate op has a vulkan kernel")
    assert gpu_device().summary not in v.adapter.split(";")[0]
