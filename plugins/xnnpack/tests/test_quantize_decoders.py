"""transformers' own decoders quantize through XNNPACK's quantizer (issue 22).

Their causal mask is built from arange/diff/cumsum and an index. After
``prepare_pt2e`` that index chain carries observers and calibration stops
("tensors used as indices must be long ..."), in stock ExecuTorch's flow as
it did in ours. It is constant at the example inputs' shapes: ``quantize``
folds constant-only subgraphs before annotation and says so in the report.
"""

from __future__ import annotations

import pytest
import torch

import edgeplug
from edgeplug import QuantizationError


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1))
    return model, ids


class _LogitsOnly(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


@pytest.fixture(scope="module")
def llama():
    model, ids = _tiny_llama()
    return _LogitsOnly(model), (ids,)


@pytest.fixture(scope="module")
def quantized(llama):
    model, inputs = llama
    return edgeplug.quantize(model, inputs, "xnnpack", "8a8w")


def test_a_transformers_decoder_quantizes_lowers_and_runs(llama, quantized):
    model, inputs = llama
    result = edgeplug.lower(quantized, inputs, "xnnpack", verify=True)
    q = result.report.quantization
    # the mask's constant-only chain was folded before annotation, and the report says so
    applied = [r for r in q.folds if r.outcome == "applied"]
    assert applied and sum(r.removed for r in applied) >= 6
    assert "folded before annotation" in result.report.to_table()
    # the .pte ran in executorch's runtime and agrees with the quantized model, and stays near the float one
    assert result.report.verification.passed
    with torch.no_grad():
        ref = model(*inputs)
    out = result.report.quantization.versus_float
    assert out and 0 < out[0] < 0.5 * float(ref.abs().max())


def test_calibration_failure_names_the_node_and_the_models_line(llama, monkeypatch):
    """Without the fold the quantizer's observers break the index chain: the error names the node and
    where in the model it came from, not only the IndexError from deep inside torch."""
    import edgeplug.quantization as quantization

    monkeypatch.setattr(quantization, "fold_before_annotation", lambda ep, backend: (ep, []))
    model, inputs = llama
    with pytest.raises(QuantizationError) as info:
        edgeplug.quantize(model, inputs, "xnnpack", "8a8w")
    msg = str(info.value)
    assert "failed at 'calibrate' at node 'index'" in msg and "aten.index.Tensor" in msg
    assert "modeling_llama.py" in msg and "IndexError" in msg
