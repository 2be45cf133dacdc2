"""XNNPACK 8a8w leaves a decomposed RMSNorm's arithmetic float, and says so.

XNNPACK has no norm op: the norm stays ``pow``, ``mean``, ``add``, ``rsqrt``, ``mul``, and its
quantizer annotates every ``add`` and ``mul``. ``variance + eps`` rounded to 8 bits with a smallest
scale of 2**-12 becomes 0 when the normalised tensor is small (a post-norm over a sublayer's
output: Gemma3, OLMo2), and ``rsqrt`` infinite. ``edgeplug.quantize`` tells the quantizer to leave
those nodes alone; the weight multiply after them is still quantized.
"""

from __future__ import annotations

import pytest
import torch

import edgeplug


class _PostNorm(torch.nn.Module):
    """x + norm(proj(x)) * w, the projection's output small (RMS ~0.01): a post-norm over a sublayer."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(64, 64, bias=False)
        self.weight = torch.nn.Parameter(1.0 + 0.2 * torch.randn(64))
        with torch.no_grad():
            self.proj.weight.mul_(0.01)

    def forward(self, x):
        h = self.proj(x)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x + self.weight * h


@pytest.fixture(scope="module")
def lowered():
    torch.manual_seed(0)
    model, x = _PostNorm().eval(), torch.randn(1, 8, 64)
    quantized = edgeplug.quantize(model, (x,), "xnnpack", "8a8w")
    return model, x, quantized, edgeplug.lower(quantized, (x,), "xnnpack")


def _observed(program) -> set[str]:
    """Names of the nodes a quantize op reads (their outputs were observed)."""
    return {n.args[0].name for n in program.graph.nodes if "quantize_per_tensor" in str(n.target) and "de" not in str(n.target)}


def test_the_norm_math_is_not_quantized_and_is_recorded(lowered):
    _, _, quantized, result = lowered
    (norm,) = quantized.quantization.float_norms
    math = [n for n in quantized.program.graph.nodes if n.target in (
        torch.ops.aten.pow.Tensor_Scalar, torch.ops.aten.mean.dim, torch.ops.aten.rsqrt.default)]
    assert len(math) == 3
    assert not _observed(quantized.program) & {n.name for n in math}
    adds = [n for n in quantized.program.graph.nodes if n.target is torch.ops.aten.add.Tensor and n.args[0] in math]
    assert adds and not _observed(quantized.program) & {n.name for n in adds}, "variance + eps was quantized"
    assert "norms whose arithmetic stayed float" in "\n".join(result.report.quantization.table_lines())


def test_the_post_norm_block_stays_close_to_float_and_the_pte_verifies(lowered):
    model, x, quantized, result = lowered
    with torch.no_grad():
        cosine = torch.nn.functional.cosine_similarity(quantized(x).flatten(), model(x).flatten(), dim=0).item()
    assert cosine > 0.995, cosine
    assert edgeplug.verify(result, "xnnpack").passed
    assert result.report.quantization.cosine_to_float[0] > 0.995
