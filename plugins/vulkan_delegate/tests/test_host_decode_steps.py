"""Host-kernel verification of a program that keeps state (a KV cache): prefill, then decode steps,
each compared with eager, the program's buffers carried from one call to the next as executorch's
runtime keeps them (a buffer the top-level program writes back, and one a delegate owns)."""

from __future__ import annotations

import pytest
import torch

import edgeplug

pytest.importorskip("edgeplug_vulkan")

_NAMES = ["prefill: output 0", "decode 1: output 0", "decode 2: output 0", "decode 3: output 0"]


class _Cache(torch.nn.Module):
    """A cache in a buffer written at the positions given (index_copy_ has no Vulkan kernel: the program
    writes the buffer back), read by the delegate: each call's output depends on every call before."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.register_buffer("k", torch.zeros(1, 16, 8))

    def forward(self, x, pos):
        self.k.index_copy_(1, pos, self.proj(x))
        return self.k.sum(1) * 2


class _Counter(torch.nn.Module):
    """A buffer read and written in one partition: on a backend whose runtime keeps a buffer moved into its
    delegate (BackendSpec.delegate_buffers) the delegate owns it and keeps its value; vulkan and webgpu keep
    it a program input, since neither of ExecuTorch's runtimes does (test_mutated_buffers)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("c", torch.zeros(1, 8))

    def forward(self, x):
        self.c.copy_(self.c * 2 + x)
        return self.c + 1


def _lose_cache_write(result, buffer: str) -> None:
    """Corrupt the lowered program: its in-place write of ``buffer`` becomes the functional op, so the new
    value reaches this call's outputs but the buffer keeps its old one (a cache write that is lost)."""
    from executorch.exir.dialects._ops import ops

    ep = result.lowered_program()  # the program verification runs (executorch's dialect: the write in place)
    name = next(s.arg.name for s in ep.graph_signature.input_specs if s.target == buffer)
    write = next(
        n for n in ep.graph_module.graph.nodes
        if n.op == "call_function" and "index_put_" in str(n.target) and getattr(n.args[0], "name", None) == name
    )
    write.target = ops.edge.aten.index_put.default
    ep.graph_module.recompile()


def test_a_written_back_cache_is_carried_to_each_decode_step_and_a_lost_write_fails_the_first():
    torch.manual_seed(0)
    result = edgeplug.lower(_Cache().eval(), (torch.randn(1, 1, 8), torch.tensor([0])), "vulkan", verify=True)
    v = result.report.verification
    assert v.method == "kernels" and v.passed, v.failures()
    assert [o.name for o in v.outputs] == _NAMES
    assert all(o.max_abs_diff <= 1e-5 for o in v.outputs)
    assert "prefill and 3 decode steps ran on the host kernels" in v.note and "Tensor(1; int64)" in v.note
    assert "k" in result.lowered_program().graph_signature.buffers_to_mutate.values()
    _lose_cache_write(result, "k")
    lost = edgeplug.verify(result, "vulkan")
    failed = [o for o in lost.outputs if o.problems]
    assert not lost.passed and failed[0].name == "decode 1: output 0"
    assert lost.outputs[0].name == "prefill: output 0" and not lost.outputs[0].problems  # this call saw the write


def test_a_buffer_the_delegate_owns_keeps_its_value_between_host_calls(owning_delegate_backend):
    pytest.importorskip("edgeplug_webgpu")
    torch.manual_seed(0)
    result = edgeplug.lower(_Counter().eval(), (torch.randn(1, 8),), owning_delegate_backend, verify=True)
    assert not result.lowered_program().graph_signature.buffers_to_mutate  # the delegate owns it
    v = result.report.verification
    assert v.passed, v.failures()
    # decode steps double the state each call: a runner starting each call from zeros gives other values
    assert [o.name for o in v.outputs] == ["prefill: output 0", "prefill: buffer 'c' (updated in forward)", *_NAMES[1:]]
