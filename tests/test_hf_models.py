"""Real model code: tiny, randomly initialised Hugging Face decoders lower with every norm fused.

Llama and Qwen2 write RMSNorm as ``w * (x * rsqrt(mean(x^2) + eps))``, Gemma as
``x * rsqrt(...) * (1 + w)`` in fp32: every norm must fuse (Gemma's through
folding ``1 + w``) and the lowered program must compute what eager computes.
Nothing is downloaded; each model is exported once per session. The backends
are the core's fixture backends: one fusing into its own op, lowered for real
and verified on its host kernel, and one keeping ``aten.rms_norm`` whole, as a
dry run (the stand-in delegate). Every first-party backend lowers these
architectures in ``make zoo`` (docs/zoo.md), beside stock ExecuTorch.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import edgeplug
from edgeplug._fusion.nodes import is_op

transformers = pytest.importorskip("transformers")

MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, "fused"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}, "fused"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 16}, "folded_weight"),
}
#: (model, fixture backend, dry run): every model on the fused op (verified); Gemma's folded weight kept whole too
CASES = [(name, "fixture-fused", False) for name in MODELS] + [("gemma", "fixture-keep", True)]


class Logits(nn.Module):
    """``input_ids -> logits`` without a cache: the contract ``edgeplug.lower`` exports."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def _build(zoo, name: str):
    """The zoo's shared decoder config (2 layers, hidden 64, 4 heads, 2 key/value heads) for ``name``."""
    config_cls, model_cls, extra, _ = MODELS[name]
    config = getattr(transformers, config_cls)(**{**zoo.DECODER, **extra})
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in norms:  # not the init's ones (or Gemma's zeros): a wrong weight must show
            m.weight.copy_(m.weight + 0.2 * torch.randn(m.weight.shape, generator=g))
    ids = torch.randint(0, zoo.VOCAB, (1, zoo.SEQ), generator=g)
    wrapped = Logits(model).eval()
    with torch.no_grad():
        ep = torch.export.export(wrapped, (ids,))
    return wrapped, ep, (ids,), len(norms)


@pytest.fixture(scope="session")
def hf_models(zoo):
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = _build(zoo, name)
        return cache[name]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("name,backend,dry_run", CASES, ids=[f"{n}-{b}" for n, b, _ in CASES])
def test_hf_decoder_lowers_with_every_norm_fused(zoo, hf_models, fixture_backends, name, backend, dry_run):
    model, ep, ids, norms = hf_models(name)
    result = edgeplug.lower(copy.deepcopy(ep), ids, backend, dry_run=dry_run, verify=not dry_run, model_name=name)
    fusions = result.report.fusions
    assert len(fusions) == norms == 2 * zoo.DECODER["num_hidden_layers"] + 1, result.report.to_table()
    expected = MODELS[name][3]
    assert all(f.outcome == expected for f in fusions), [(f.anchor, f.outcome, f.reason) for f in fusions]
    assert all(f.eps == pytest.approx(1e-6, rel=1e-6) for f in fusions)

    target = edgeplug.get_backend(backend).fusion_policy("rms_norm").target.replace(".", "::")
    with torch.no_grad():
        eager = model(*ids)
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    # a dry run lowers to a stand-in delegate: the fused ops are inside the partitions either way
    delegated = sum(
        is_op(n, target)
        for _, lowered, _ in get_lowered_submodules(result.edge.exported_program().graph_module)
        for n in lowered.original_module.graph_module.graph.nodes
    )
    assert delegated == norms, result.report.to_table()
    if dry_run:
        # the stand-in cannot run; the fused op's numerics are the core's (tests/test_fusion*.py), and
        # the program the partitioner got holds the fused ops (fused on the aten program)
        assert sum(is_op(n, target) for n in result.exported_program.graph_module.graph.nodes) == norms
    else:
        v = result.report.verification
        assert v is not None and v.max_abs_diff < 1e-4, result.report.to_table()
