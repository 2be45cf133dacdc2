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
    import edgeplug._quantize.quantize as quantization

    monkeypatch.setattr(quantization, "fold_before_annotation", lambda ep, backend: (ep, []))
    model, inputs = llama
    with pytest.raises(QuantizationError) as info:
        edgeplug.quantize(model, inputs, "xnnpack", "8a8w")
    msg = str(info.value)
    assert "failed at 'calibrate' at node 'index'" in msg and "aten.index.Tensor" in msg
    assert "modeling_llama.py" in msg and "IndexError" in msg


# -- torchao's source transform: 8da4w (int8 dynamic activations, int4 grouped weights) -----------


@pytest.fixture(scope="module")
def lowered_8da4w(llama):
    model, inputs = llama
    before = {k: v.clone() for k, v in model.state_dict().items()}
    quantized = edgeplug.quantize(model, inputs, "xnnpack", "8da4w")
    result = edgeplug.lower(quantized, inputs, "xnnpack", verify=True)
    return before, quantized, result


def test_8da4w_lowers_runs_and_stays_near_float(llama, lowered_8da4w):
    model, inputs = llama
    before, quantized, result = lowered_8da4w
    report = result.report
    # the .pte ran in executorch's runtime and agrees with the transformed eager model
    assert report.verification.passed and report.verification.method == "pte"
    q = report.quantization
    assert (q.scheme, q.kind, q.weight_bits) == ("8da4w", "source_transform", 4)
    assert q.reference == "the quantized model's eager output"
    # the float figure: near the float model, and not the float model itself (the weights were rounded)
    assert len(q.cosine_to_float) == 1 and 0.98 <= q.cosine_to_float[0] < 1.0
    assert q.versus_float[0] > q.versus_quantized[0] > 0
    # the quantized model's own figure, computed here from its eager output: what the scheme cost before lowering
    with torch.no_grad():
        own = torch.nn.functional.cosine_similarity(
            quantized(*inputs).double().flatten(), model(*inputs).double().flatten(), dim=0).item()
    assert q.quantized_cosine_to_float == [pytest.approx(own, abs=1e-6)] and own < 1.0
    assert abs(q.cosine_to_float[0] - own) < 1e-3  # the lowering adds (next to) nothing to the scheme's cost
    table = report.to_table()
    assert "torchao source transform" in table and f"(the quantized model's own: {own:.4f})" in table
    # XNNPACK took every linear, each as the dynamically quantized form (no float linear, none on the CPU)
    assert not any("linear" in op or "mm" in op for op in report.cpu_ops)
    assert report.delegated_ops.get("aten.linear.default", 0) == 8  # 7 in the layer, the head
    assert report.delegated_ops.get("torchao.choose_qparams_affine.default", 0) >= 1
    # the caller's model is unchanged
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert all(type(m.weight) is torch.nn.Parameter for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_8da4w_verification_catches_a_wrong_weight(llama, lowered_8da4w):
    """The default tolerance of a dynamically quantized output is tight enough that a program one weight
    group off disagrees: the same .pte checked against a model with one group of one layer changed fails."""
    from edgeplug._verify.quantized import DYNAMIC_RELATIVE

    model, inputs = llama
    _, quantized, result = lowered_8da4w
    with torch.no_grad():
        right = quantized(*inputs)
        wrong = edgeplug.quantize(_perturbed(model), inputs, "xnnpack", "8da4w")(*inputs)
    tolerance = DYNAMIC_RELATIVE * right.abs().max().item()
    assert edgeplug.verify(result, "xnnpack", reference=[right], tolerance=tolerance).passed
    assert not edgeplug.verify(result, "xnnpack", reference=[wrong], tolerance=tolerance).passed


def _perturbed(wrapper):
    import copy

    other = copy.deepcopy(wrapper)
    with torch.no_grad():
        w = other.model.model.layers[0].mlp.down_proj.weight
        w[:, :32] = -w[:, :32] * 4  # one group of each row: negated and scaled
    return other


def test_unknown_and_misused_source_transform_schemes_fail_before_work(llama, monkeypatch):
    model, inputs = llama
    import torch.export

    def no_export(*a, **k):
        raise AssertionError("exported before the scheme was checked")

    with pytest.raises(QuantizationError, match=r"no quantization scheme '8da3w'.*did you mean '8da4w'"):
        monkeypatch.setattr(torch.export, "export", no_export)
        edgeplug.quantize(model, inputs, "xnnpack", "8da3w")
    monkeypatch.undo()
    # a source transform rewrites the module: it takes no calibration data and no ExportedProgram
    with pytest.raises(QuantizationError, match="takes no calibration data"):
        edgeplug.quantize(model, inputs, "xnnpack", "8da4w", calibration=[inputs])
    ep = torch.export.export(model, inputs)
    with pytest.raises(QuantizationError, match="needs the nn.Module, not an ExportedProgram"):
        edgeplug.quantize(ep, inputs, "xnnpack", "8da4w")


def test_the_schemes_are_listed():
    schemes = {s.scheme: s for s in edgeplug.get_backend("xnnpack").records(edgeplug.QuantScheme)}
    assert {"8a8w", "8da4w", "8da4w-g128", "e4", "e8"} <= schemes.keys()
    assert schemes["8da4w"].kind == "source_transform" and schemes["8a8w"].kind == "pt2e"
    assert schemes["8da4w-g128"].factory().weight_granularity.group_size == 128


def test_4_bit_embeddings_run_in_executorchs_quantized_kernel(llama):
    """XNNPACK takes no embedding; the lowering fuses torchao's dequantize + embedding into executorch's
    quantized embedding op (its quantized kernels run it), and the .pte verifies against the quantized model."""
    model, inputs = llama
    result = edgeplug.lower(edgeplug.quantize(model, inputs, "xnnpack", "e4"), inputs, "xnnpack", verify=True)
    assert result.report.verification.passed
    ops = {str(n.target) for n in result.program.exported_program().graph.nodes}
    assert any("embedding_4bit" in op for op in ops) and not any("dequantize_affine" in op for op in ops)
    q = result.report.quantization
    assert q.versus_float[0] > 0 and 0.98 <= q.cosine_to_float[0] < 1.0


class _PaddedTable(torch.nn.Module):
    """An embedding with a padding index (Gemma, Phi-3 and OLMo2 declare one), then a projection."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(128, 64, padding_idx=0)
        self.proj = torch.nn.Linear(64, 32)

    def forward(self, ids):
        return self.proj(self.table(ids))


def test_an_embedding_with_a_padding_index_quantizes_into_executorchs_quantized_kernel():
    torch.manual_seed(0)
    model, inputs = _PaddedTable().eval(), (torch.tensor([[0, 5, 17, 127, 3]]),)
    result = edgeplug.lower(edgeplug.quantize(model, inputs, "xnnpack", "e8"), inputs, "xnnpack", verify=True)
    assert result.report.verification.passed  # the .pte ran; it failed at serialization ("Missing out variants")
    ops = {str(n.target) for n in result.program.exported_program().graph.nodes}
    assert any("embedding_byte" in op for op in ops) and not any("dequantize_affine" in op for op in ops)
    (record,) = [r for r in result.report.quantization.rewrites if r.transform == "drop_embedding_padding_idx"]
    assert "padding_idx=0 dropped" in record.detail
    assert "padding_idx=0 dropped" in result.report.to_table()
