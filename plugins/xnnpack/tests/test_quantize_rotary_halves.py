"""XNNPACK 8a8w: the rotary halves behind a cast are quantized like their producer, and the .pte loads.

Gemma's q/k norm ends in ``type_as(x)``, a cast to the dtype the tensor already has. XNNPACK's
quantizer shares a producer's quantization with a slice only when the slice reads that producer
directly, so behind the cast the two halves of ``rotate_half`` were left unannotated; the
partitioner still took ``dequantize -> slice`` (a float output) into the delegate, and executorch's
runtime refused the .pte at load ("Failed to create static slice node ... invalid_parameter").
``edgeplug.quantize`` drops such no-op casts (and export's metadata checks) before annotation and
records each.
"""

from __future__ import annotations

import pytest
import torch

import edgeplug


class _NormThenRotary(torch.nn.Module):
    """q = type_as(norm(proj(x)) * (1 + w), x) split into heads, then q * cos + rotate_half(q) * sin."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(64, 64, bias=False)
        self.weight = torch.nn.Parameter(0.2 * torch.randn(16))

    def forward(self, x):
        q = self.proj(x).view(1, 8, 4, 16).transpose(1, 2)
        h = q.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + self.weight.float())
        q = h.type_as(q)
        half = torch.cat((-q[..., 8:], q[..., :8]), dim=-1)
        angles = torch.arange(8.0).view(1, 1, 8, 1) * torch.arange(1.0, 17.0) / 16
        return q * angles.cos() + half * angles.sin()


@pytest.fixture(scope="module")
def lowered():
    torch.manual_seed(0)
    model, x = _NormThenRotary().eval(), torch.randn(1, 8, 64)
    quantized = edgeplug.quantize(model, (x,), "xnnpack", "8a8w")
    return quantized, edgeplug.lower(quantized, (x,), "xnnpack")


def test_the_no_op_casts_are_dropped_and_recorded(lowered):
    quantized, result = lowered
    dropped = quantized.quantization.rewrites
    assert any(r.op == "type_as.default" for r in dropped), [r.op for r in dropped]
    assert all(r.transform == "drop_no_op_casts" and r.detail.endswith("computes nothing") for r in dropped)
    assert not [n for n in quantized.program.graph.nodes if n.target is torch.ops.aten.type_as.default]
    assert "no-op casts and metadata checks dropped before annotation" in "\n".join(
        result.report.quantization.table_lines()
    )


def test_every_delegated_slice_of_a_dequantized_tensor_is_requantized_alike(lowered):
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    from edgeplug.plugin import op_name

    slices = []
    for _, module, _ in get_lowered_submodules(lowered[1].edge.exported_program().graph_module):
        for node in module.original_module.graph.nodes:
            if node.op == "call_function" and op_name(node) == "aten.slice_copy.Tensor":
                (user,) = node.users
                slices.append((node.name, op_name(node.args[0]), op_name(user)))
    assert len(slices) == 2, slices
    for name, source, user in slices:
        assert "dequantize" in source and user.startswith("quantized_decomposed.quantize"), (name, source, user)


def test_the_pte_loads_and_verifies_in_executorchs_runtime(lowered):
    verification = edgeplug.verify(lowered[1], "xnnpack")
    assert verification.passed, verification.failures()
