"""Every built-in model, in one registry: one name per model, and the name says what the model is.

Three families, built in code and seeded (nothing is downloaded):

- ``handwritten-*``: small models written in plain torch (``edgeplug.examples.llama``): a Llama-style
  decoder, a Gemma-style block, an MLP;
- ``transformers-*``: transformers' own classes (``LlamaForCausalLM``, ``Qwen3ForCausalLM``, ...) with a
  tiny config (``Arch``), built by the zoo (``edgeplug._zoo._models.build_arch``);
- ``executorch-*``: executorch's own Llama transformer (``executorch.examples.models.llama``) of a
  tiny ``ModelArgs``, as it is and configured as other models (``edgeplug.testing.programs``);
- ``testing-*``: the programs of ``edgeplug.testing.programs`` (ExecuTorch's cached-attention custom
  ops, MobileNet's building blocks).

Both commands take every name of this table (``edgeplug lower handwritten-llama-decoder``, ``edgeplug zoo
--models transformers-llama``), and each keeps shorter names, a view of it: ``edgeplug lower NAME``
(``EXAMPLE_NAMES``; ``edgeplug.examples.EXAMPLES``) and ``edgeplug zoo --models NAME`` (``ZOO_NAMES``;
``edgeplug._zoo.MODELS``). ``llama`` was both commands' name for different models (the hand-written
decoder, transformers' LlamaForCausalLM): the zoo keeps it, and ``edgeplug lower llama`` works deprecated
(``edgeplug._api.RENAMES``, kind "model"), saying so. ``PUBLIC_NAME_CLASHES`` lists such names, each
deprecated in one command; tests/test_model_registry.py refuses any other. tests/test_et_examples.py's
case names (``llama``, ``qwen3``, ...) are its own view of the ``executorch-*`` and ``testing-*`` models.

Listing the models imports neither torch nor transformers: a builder is named as ``module:function``
and imported when the model is built.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Optional

from edgeplug._errors import EdgeplugError

SEQ, VOCAB = 8, 128
#: shared by every transformers decoder config: 2 layers, hidden 64, 4 heads of 16, 2 key/value heads
DECODER = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
)


@dataclass(frozen=True)
class Arch:
    """One transformers architecture: config and model classes, config overrides, call kwargs."""

    config: str
    model: str
    overrides: dict = field(default_factory=dict)
    base: dict = field(default_factory=lambda: dict(DECODER))
    call: dict = field(default_factory=lambda: {"use_cache": False})
    output: str = "logits"
    note: str = ""


@dataclass(frozen=True)
class Model:
    """One built-in model: its registry name, what it is, and the function that builds it."""

    name: str
    what: str
    #: ``module:function`` returning ``(model, args)``; imported when the model is built
    builder: str
    #: keyword arguments the builder is called with (the one builder of several models tells them apart)
    options: tuple[tuple[str, Any], ...] = ()
    #: a transformers model's architecture (its builder takes it first)
    arch: Optional[Arch] = None

    def build(self, **options: Any) -> tuple[Any, tuple[Any, ...]]:
        """``(model, args)``: the same numbers on every call, in every process."""
        module, _, function = self.builder.partition(":")
        fn = getattr(importlib.import_module(module), function)
        options = {**dict(self.options), **options}
        return fn(self.arch, **options) if self.arch is not None else fn(**options)


def _transformers(short: str, config: str, model: str, overrides: Optional[dict] = None, **fields: Any) -> Model:
    arch = Arch(config, model, dict(overrides or {}), **fields)
    note = f" ({arch.note})" if arch.note else ""
    return Model(
        f"transformers-{short}",
        f"transformers' {model} with a tiny random config{note}",
        "edgeplug._zoo._models:build_arch",
        arch=arch,
    )


def _encoder(short: str, config: str, model: str, base: dict, note: str) -> Model:
    """A transformers encoder: called without a cache, its output the last hidden state (no logits)."""
    return _transformers(short, config, model, base=base, call={}, output="last_hidden_state", note=f"encoder, {note}")


def _table(*models: Model) -> dict[str, Model]:
    table: dict[str, Model] = {}
    for m in models:
        if m.name in table:  # a dict literal would keep the second silently
            raise EdgeplugError(f"two built-in models are named {m.name!r}: {table[m.name].what}; {m.what}")
        table[m.name] = m
    return table


MODELS: dict[str, Model] = _table(
    Model(
        "handwritten-llama-decoder",
        "tiny Llama-style decoder: RMSNorm, causal attention, SwiGLU (2 layers, dim 64)",
        "edgeplug.examples.llama:tiny_llama",
    ),
    Model(
        "handwritten-gemma-block",
        "Gemma-style block: RMSNorm scaled by (1 + w), attention, GeGLU",
        "edgeplug.examples.llama:gemma_style_block",
    ),
    Model("handwritten-mlp", "two linear layers with a GELU (smallest smoke test)", "edgeplug.examples.llama:small_mlp"),
    _transformers("llama", "LlamaConfig", "LlamaForCausalLM"),
    _transformers("qwen3", "Qwen3Config", "Qwen3ForCausalLM", note="q/k norms"),
    _transformers("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", note="text; norms weighted 1 + w, q/k norms"),
    _transformers(
        "olmoe", "OlmoeConfig", "OlmoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2, "eos_token_id": 1},
        note="mixture of experts",
    ),
    _transformers(
        "falcon-mamba",
        "FalconMambaConfig",
        "FalconMambaForCausalLM",
        base=dict(vocab_size=VOCAB, hidden_size=64, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4),
        note="state-space (Mamba-1), unweighted norms of B, C and dt",
    ),
    _encoder(
        "bert",
        "BertConfig",
        "BertModel",
        dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64),
        "LayerNorm (no RMSNorm)",
    ),
    _transformers("mistral", "MistralConfig", "MistralForCausalLM"),
    _transformers("phi3", "Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0, "eos_token_id": 1}),
    _transformers(
        "olmo2", "Olmo2Config", "Olmo2ForCausalLM", {"eos_token_id": 1},
        note="norms after attention/MLP, q/k norms over all heads",
    ),
    _transformers(
        "bamba",
        "BambaConfig",
        "BambaForCausalLM",
        {"attn_layer_indices": [1], "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 1,
         "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 8},
        note="hybrid: a Mamba-2 layer, then an attention layer; gated norm in the mixer",
    ),
    _encoder(
        "t5-encoder",
        "T5Config",
        "T5EncoderModel",
        dict(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4),
        "RMSNorm without mean subtraction (T5LayerNorm)",
    ),
    _transformers(
        "jamba",
        "JambaConfig",
        "JambaForCausalLM",
        {"num_experts": 2, "num_experts_per_tok": 1, "attn_layer_period": 2, "attn_layer_offset": 1,
         "expert_layer_period": 2, "expert_layer_offset": 1, "mamba_d_state": 8, "mamba_d_conv": 4,
         "mamba_expand": 2, "mamba_dt_rank": 8},
        note="hybrid: a Mamba layer, then attention with a mixture of experts",
    ),
    Model(
        "executorch-llama",
        "executorch's own Llama transformer (examples/models/llama) of a tiny ModelArgs, no KV cache",
        "edgeplug.testing.programs:_executorch_llama",
        options=(("norm_eps", 1e-5),),
    ),
    Model(
        "executorch-llama-kv",
        "executorch's Llama transformer with its KV cache: one decode step, inputs (ids, {input_pos})",
        "edgeplug.testing.programs:_executorch_llama",
        options=(("norm_eps", 1e-5), ("use_kv_cache", True)),
    ),
    Model(
        "executorch-llama-as-qwen3",
        "executorch's Llama transformer configured as Qwen3: q/k norms before RoPE, HF RoPE",
        "edgeplug.testing.programs:_executorch_llama",
        options=(("norm_eps", 1e-6), ("use_qk_norm", True), ("qk_norm_before_rope", True), ("use_hf_rope", True),
                 ("rope_theta", 1e6)),
    ),
    Model(
        "executorch-llama-as-lfm2",
        "executorch's Llama transformer with LFM2's layers: a short convolution, then full attention",
        "edgeplug.testing.programs:_executorch_llama",
        options=(("norm_eps", 1e-5), ("layer_types", ["conv", "full_attention"])),
    ),
    Model(
        "testing-cached-attention",
        "one attention block over a static KV cache through ExecuTorch's llama::update_cache and "
        "llama::custom_sdpa, exported with a dynamic sequence length",
        "edgeplug.testing.programs:cached_attention",
    ),
    Model(
        "testing-mobilenet-v2-blocks",
        "tiny MobileNet v2 of its building blocks: conv + batch norm + relu6, inverted residuals",
        "edgeplug.testing.programs:mobilenet_blocks",
        options=(("version", "v2"),),
    ),
    Model(
        "testing-mobilenet-v3-blocks",
        "tiny MobileNet v3 of its building blocks: hardswish, 5x5 depthwise convolutions, squeeze-excitation",
        "edgeplug.testing.programs:mobilenet_blocks",
        options=(("version", "v3"),),
    ),
)

#: ``edgeplug lower NAME``'s short names (``edgeplug examples``): public name -> registry name
EXAMPLE_NAMES: dict[str, str] = {
    "llama": "handwritten-llama-decoder",
    "gemma-block": "handwritten-gemma-block",
    "mlp": "handwritten-mlp",
}

#: ``edgeplug zoo --models NAME`` (and the zoo's cell records, docs/zoo.md): public name -> registry name
ZOO_NAMES: dict[str, str] = {
    m.name.removeprefix("transformers-"): m.name for m in MODELS.values() if m.name.startswith("transformers-")
}

#: public names that two commands give to different models, each deprecated in one of them
#: (``edgeplug._api.RENAMES``, kind "model"): name -> what each command means by it
PUBLIC_NAME_CLASHES: dict[str, str] = {
    "llama": "`edgeplug lower llama` (deprecated) is handwritten-llama-decoder, `edgeplug zoo --models llama` is "
    "transformers-llama",
}
