"""A grouped torchao scheme leaves float the layers its group does not divide, and names them.

torchao's grouped configs need each weight's last size to be a multiple of the group:
Mamba's dt projection takes dt_rank = 4 inputs, and 8da4w (groups of 32) used to fail
the whole model ("Expecting input size at 1 dimension: 4 to be divisible by block_size
at 1 dimension: 32"). Such a layer now stays float, with a line in the report; the
others are quantized and the program lowers and runs.
"""

from __future__ import annotations

import pytest
import torch

import edgeplug


class _NarrowProjection(torch.nn.Module):
    """x -> wide (64 -> 64), a rank-4 bottleneck (64 -> 4), back up (4 -> 64): the last one has width 4."""

    def __init__(self) -> None:
        super().__init__()
        self.wide, self.down, self.up = (torch.nn.Linear(64, 64), torch.nn.Linear(64, 4), torch.nn.Linear(4, 64))

    def forward(self, x):
        return self.up(self.down(self.wide(x)))


@pytest.fixture(scope="module")
def lowered():
    torch.manual_seed(0)
    model, x = _NarrowProjection().eval(), torch.randn(1, 8, 64)
    quantized = edgeplug.quantize(model, (x,), "xnnpack", "8da4w")
    return model, x, quantized, edgeplug.lower(quantized, (x,), "xnnpack")


def test_the_narrow_layer_stays_float_and_is_named(lowered):
    _, _, quantized, result = lowered
    (kept,) = quantized.quantization.kept_float
    assert kept.startswith("up (Linear, weight (64, 4))") and "not a multiple of the group size 32" in kept
    lines = "\n".join(result.report.quantization.table_lines())
    assert "layers kept float: 1" in lines and "up (Linear, weight (64, 4))" in lines


def test_the_other_layers_are_quantized_and_the_program_verifies(lowered):
    model, x, quantized, result = lowered
    dequantized = [n for n in quantized.program.graph.nodes if "dequantize_affine" in str(n.target)]
    assert len(dequantized) >= 2, "wide and down should be quantized"
    assert edgeplug.verify(result, "xnnpack").passed
    with torch.no_grad():
        cosine = torch.nn.functional.cosine_similarity(quantized(x).flatten(), model(x).flatten(), dim=0).item()
    assert cosine > 0.98, cosine


def test_a_model_whose_widths_all_divide_keeps_nothing_float():
    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(64, 32)).eval(), torch.randn(1, 8, 64)
    assert edgeplug.quantize(model, (x,), "xnnpack", "8da4w").quantization.kept_float == []


def test_an_embedding_scheme_keeps_a_table_its_group_does_not_divide():
    class _Embed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table, self.proj = torch.nn.Embedding(16, 48), torch.nn.Linear(48, 8)

        def forward(self, ids):
            return self.proj(self.table(ids))

    torch.manual_seed(0)
    ids = torch.randint(0, 16, (1, 8))
    (kept,) = edgeplug.quantize(_Embed().eval(), (ids,), "xnnpack", "e4").quantization.kept_float
    assert kept.startswith("table (Embedding, weight (16, 48))") and "group size 32" in kept
