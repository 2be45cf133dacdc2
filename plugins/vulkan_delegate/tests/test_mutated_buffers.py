"""A buffer the program writes (a KV cache, transformers' ``cumulative_length``) on the Vulkan delegate.

executorch's ``tag_mutated_buffer`` gives a written buffer to the delegate that reads it, and
``to_backend`` then moves the buffer into that delegate. When the value written back is computed
elsewhere (another partition, past an op left on the CPU), the program's signature names a buffer
it no longer has and executorch's verifier fails the lowering ("Buffer output getitem_N does not
point to a buffer that exists"; seen on optimum-executorch's Llama, whose static cache counts the
tokens in ``cumulative_length``). The core keeps such a buffer a program input instead.
"""

from __future__ import annotations

import pytest
import torch

import edgeplug


class _ReadHereWrittenThere(torch.nn.Module):
    """The buffer is read by one partition and its new value computed by another: the cumsum between
    them has no Vulkan kernel, and it reads the first partition's output."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("c", torch.zeros(1, 8))

    def forward(self, x):
        y = self.c * 2 + x
        gate = torch.cumsum(y, -1) > 0
        self.c.copy_(y * gate.float() + 1)
        return y


class _ReadAndWrittenInOne(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("c", torch.zeros(1, 8))

    def forward(self, x):
        y = self.c * 2 + x
        self.c.copy_(y + 1)
        return y


def _top_level_buffers(result) -> set:
    # the program as ExecuTorch's runtime runs it (after to_executorch): what it writes back itself
    return set(result.lowered_program().graph_signature.buffers_to_mutate.values())


#: what stays on the CPU: cumsum has no kernel in either runtime; the WebGPU runtime has no gt.Scalar either, and
#: webgpu leaves bool tensors on the CPU (edgeplug_webgpu.runtime_ops)
_ON_THE_CPU = {
    "vulkan": {"aten.cumsum.default": 1},
    "webgpu": {"aten.cumsum.default": 1, "aten.gt.Scalar": 1, "dim_order_ops._to_dim_order_copy.default": 1},
}


@pytest.mark.parametrize("backend", ["vulkan", "webgpu"])
def test_a_buffer_written_by_another_partition_stays_a_program_input(backend):
    pytest.importorskip(f"edgeplug_{backend}")
    torch.manual_seed(0)
    model, x = _ReadHereWrittenThere().eval(), torch.randn(1, 8)
    result = edgeplug.lower(model, (x,), backend, verify=True)
    report = result.report
    assert len(report.partitions) == 2 and dict(report.cpu_ops) == _ON_THE_CPU[backend]
    assert report.verification.passed, report.verification.failures()
    assert _top_level_buffers(result) == {"c"}  # written back by the program, not by a delegate
    assert torch.count_nonzero(model.c) == 0  # the caller's buffer as it was


def test_a_buffer_read_and_written_in_one_partition_goes_to_that_delegate(owning_delegate_backend):
    """A backend with BackendSpec.delegate_buffers=True: the delegate that reads and writes the buffer owns it."""
    pytest.importorskip("edgeplug_webgpu")
    torch.manual_seed(0)
    result = edgeplug.lower(_ReadAndWrittenInOne().eval(), (torch.randn(1, 8),), owning_delegate_backend, verify=True)
    assert len(result.report.partitions) == 1 and not result.report.cpu_ops
    assert result.report.verification.passed, result.report.verification.failures()
    assert _top_level_buffers(result) == set()  # the delegate owns it


@pytest.mark.parametrize("backend", ["vulkan", "webgpu"])
def test_every_written_buffer_stays_a_program_input(backend):
    """vulkan and webgpu (delegate_buffers=False): ExecuTorch's Vulkan and WebGPU runtimes do not keep a buffer
    moved into a delegate (the graph declares the new value as an output the call does not pass: Vulkan's
    refuses, WebGPU's reads past the call's arguments and crashes), so even a buffer read and written in one
    partition stays a program input, its new value a delegate output the program writes back."""
    pytest.importorskip(f"edgeplug_{backend}")
    torch.manual_seed(0)
    model = _ReadAndWrittenInOne().eval()
    result = edgeplug.lower(model, (torch.randn(1, 8),), backend, verify=True)
    assert len(result.report.partitions) == 1 and not result.report.cpu_ops
    assert result.report.verification.passed, result.report.verification.failures()
    assert _top_level_buffers(result) == {"c"}
    assert edgeplug.get_backend(backend).spec.delegate_buffers is False
