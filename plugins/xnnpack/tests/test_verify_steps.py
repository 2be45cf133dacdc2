"""``verify_steps`` (``--verify-steps N``): greedy generation through the loaded .pte, token for token
against eager, on executorch's own tiny KV-cache Llama lowered for xnnpack with a dynamic length (its
decode steps take one token). Where the ids differ, the check names the first step and eager's logit
margin there; the figures are recomputed here by hand, greedy in eager, so a wrong step or margin fails.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

import edgeplug
from edgeplug import EdgeplugError
from edgeplug._eager import EagerModel
from edgeplug.testing.faults import CorruptWeight

SEQ, STEPS = 8, 12


def _llama(seed: int):
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    torch.manual_seed(seed)
    args = ModelArgs(
        dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=128, max_seq_len=64, max_context_len=64,
        use_kv_cache=True,
    )
    return construct_transformer(args).eval()


def _dynamic():
    seq = torch.export.Dim("seq", min=1, max=63)
    return ({1: seq}, {"input_pos": {0: seq}})


def _greedy_by_hand(model, tokens, steps):
    """Greedy ids and each step's logits, in eager, one token a decode step (what the check must match)."""
    model = copy.deepcopy(model)
    ids, logits = [], []
    with torch.no_grad():
        out = model(tokens, {"input_pos": torch.arange(tokens.shape[1])})
        for k in range(steps):
            last = out.reshape(-1, out.shape[-1])[-1]
            logits.append(last)
            ids.append(int(last.argmax()))
            out = model(torch.tensor([[ids[-1]]]), {"input_pos": torch.tensor([tokens.shape[1] + k])})
    return ids, logits


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(0, 128, (1, SEQ), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def model():
    return _llama(0)


@pytest.fixture(scope="module")
def lowered(model, prompt):
    return edgeplug.lower(
        model, (prompt, {"input_pos": torch.arange(SEQ)}), backend="xnnpack", verify=True, verify_steps=STEPS,
        dynamic_shapes=_dynamic(),
    )


def test_greedy_tokens_of_the_pte_are_eagers(lowered, model, prompt):
    v = lowered.report.verification
    g = v.greedy
    assert v.passed and g.passed and g.ran, v.failures()
    ids, _ = _greedy_by_hand(model, prompt, STEPS)
    assert g.lowered_ids == g.reference_ids == ids
    assert len(set(ids)) > 1  # a generation that says something, not one repeated token
    assert (g.steps, g.prompt_tokens, g.first_difference, g.reference) == (STEPS, SEQ, None, "eager")
    assert f"greedy {STEPS} tokens after a {SEQ}-token prompt vs eager: all {STEPS} ids agree" in lowered.report.to_table()
    data = json.loads(lowered.report.to_json())
    assert data["verification"]["greedy"]["lowered_ids"] == ids and data["summary"]["verified"] is True


def test_against_another_model_the_check_names_the_first_step_and_eagers_margin(lowered, prompt):
    """The same .pte against a different model's eager run: the step where greedy parts, and the margin there."""
    other = _llama(3)
    theirs, their_logits = _greedy_by_hand(other, prompt, STEPS)
    mine = lowered.report.verification.greedy.lowered_ids
    first = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
    top = torch.topk(their_logits[first], 2).values
    result = copy.copy(lowered)
    result.reference = copy.copy(lowered.reference)
    result.reference.model = EagerModel.of_module(other)
    g = edgeplug.verify(result, "xnnpack", verify_steps=STEPS).greedy
    assert not g.passed and not g.tie
    assert g.first_difference == first and g.reference_ids == theirs and g.lowered_ids == mine
    assert g.margin == pytest.approx(float(top[0] - top[1]), abs=1e-5)
    assert f"first differs at step {first}" in g.summary() and "FAILED" in g.summary()


def test_a_corrupted_weight_fails_the_greedy_check_at_its_first_token(edgeplug_register, model, prompt):
    edgeplug_register(CorruptWeight(("xnnpack",), "nan", weight_suffix="layers.1.feed_forward.w2.weight"))
    result = edgeplug.lower(
        model, (prompt, {"input_pos": torch.arange(SEQ)}), backend="xnnpack", verify=True, verify_steps=4,
        dynamic_shapes=_dynamic(),
    )
    v = result.report.verification
    g = v.greedy
    _, logits = _greedy_by_hand(model, prompt, 1)
    top = torch.topk(logits[0], 2).values
    assert not v.passed and g.ran and g.first_difference == 0 and not g.tie
    assert g.margin == pytest.approx(float(top[0] - top[1]), abs=1e-5)
    assert any(line.startswith(f"greedy 4 tokens after a {SEQ}-token prompt vs eager: first differs at step 0")
               for line in v.failures()), v.failures()


def test_a_fixed_length_program_is_not_passed_unchecked(model, prompt):
    """Its decode steps would re-feed the prompt's length, not one token: the check says so, and fails."""
    result = edgeplug.lower(model, (prompt, {"input_pos": torch.arange(SEQ)}), backend="xnnpack")
    v = edgeplug.verify(result, "xnnpack", verify_steps=4)
    assert all(o.passed for o in v.outputs) and not v.passed
    assert not v.greedy.ran and "fixed at 8 tokens" in v.greedy.reason and "dynamic sequence length" in v.greedy.reason


def test_verify_steps_is_refused_before_any_work_without_verify_or_below_one(model, prompt):
    with pytest.raises(EdgeplugError, match="pass verify=True"):
        edgeplug.lower(model, (prompt, {"input_pos": torch.arange(SEQ)}), backend="xnnpack", verify_steps=4)
    with pytest.raises(EdgeplugError, match="whole number >= 1"):
        edgeplug.lower(model, (prompt, {"input_pos": torch.arange(SEQ)}), backend="xnnpack", verify=True, verify_steps=0)


@pytest.fixture(scope="module")
def optimum_8da4w():
    """A tiny Llama quantized by optimum-executorch's own recipe (linear 8da4w group 32, embedding 8w)
    and exported by its CausalLMExportableModule: dynamic length, keyword inputs, torchao's ops."""
    integrations = pytest.importorskip("optimum.exporters.executorch.integrations")
    quantization = pytest.importorskip("optimum.exporters.executorch.quantization")
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static", max_length=48, cache_config={"batch_size": 1, "max_cache_len": 48}
    )
    quantization.quantize_model_(model, qlinear_config="8da4w", qlinear_group_size=32, qembedding_config="8w",
                                 qembedding_group_size=0)
    ep = integrations.CausalLMExportableModule(
        model, max_seq_len=48, use_custom_sdpa=False, use_custom_kv_cache=False
    ).export()["model"]
    kwargs = {"input_ids": torch.randint(0, 128, (1, SEQ), generator=torch.Generator().manual_seed(2)),
              "cache_position": torch.arange(SEQ)}
    return edgeplug.lower(ep, kwargs=kwargs, backend="xnnpack", verify=True, verify_steps=24)


@pytest.mark.slow
def test_optimums_8da4w_program_is_checked_against_the_quantized_model(optimum_8da4w):
    """Its activations are quantized per call (torchao's choose_qparams): the logits are held to a fraction
    of their magnitude, not fp32's 1e-4, and greedy generation compares with the quantized model."""
    v = optimum_8da4w.report.verification
    assert v.passed, v.failures()
    assert all("dynamically quantized activations" in o.tolerance_reason for o in v.outputs), v.outputs
    assert v.max_abs_diff > 1e-4  # XNNPACK's activation rounding is not torchao's bit for bit
    g = v.greedy
    assert g.ran and g.reference == "the quantized model" and len(g.lowered_ids) == 24
    assert g.first_difference is None or (g.tie and g.margin <= 2 * g.logits_max_abs_diff), g.summary()
