"""executorch's Llama with its custom ops (``export_llama --use_sdpa_with_kv_cache``): attention as
``llama::custom_sdpa`` and cache writes as ``llama::update_cache``, which XNNPACK does not take. The
program lowers for xnnpack with both left on the CPU between the partitions, and decodes: prefill,
one-token decode steps and greedy generation through the loaded .pte agree with eager."""

from __future__ import annotations

import copy

import pytest
import torch

import edgeplug

SEQ, STEPS = 8, 12


@pytest.fixture(scope="module")
def models():
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  registers the llama:: ops
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs
    from executorch.examples.models.llama.source_transformation.custom_kv_cache import (
        replace_kv_cache_with_custom_kv_cache,
    )
    from executorch.examples.models.llama.source_transformation.sdpa import replace_sdpa_with_custom_op

    torch.manual_seed(0)
    args = ModelArgs(
        dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=128, max_seq_len=64, max_context_len=64,
        use_kv_cache=True,
    )
    plain = construct_transformer(args).eval()
    custom = replace_kv_cache_with_custom_kv_cache(replace_sdpa_with_custom_op(copy.deepcopy(plain)))
    return plain, custom


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(0, 128, (1, SEQ), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def lowered(models, prompt):
    seq = torch.export.Dim("seq", min=1, max=63)
    return edgeplug.lower(
        models[1], (prompt, {"input_pos": torch.arange(SEQ)}), backend="xnnpack", verify=True, verify_steps=STEPS,
        dynamic_shapes=({1: seq}, {"input_pos": {0: seq}}),
    )


def test_the_custom_ops_stay_on_the_cpu_between_partitions(lowered):
    report = lowered.report
    assert report.cpu_ops.get("llama.custom_sdpa.default") == 2, report.cpu_ops
    writes = [op for op in report.cpu_ops if "llama.update_cache" in op]
    assert writes and sum(report.cpu_ops[op] for op in writes) == 4, report.cpu_ops  # k and v of 2 layers
    assert len(report.partitions) >= 2 and all(p.backend_id == "XnnpackBackend" for p in report.partitions)
    ops = {str(n.target) for n in lowered.program.exported_program().graph.nodes if n.op == "call_function"}
    assert any("custom_sdpa" in o for o in ops) and any("update_cache" in o for o in ops), ops


def test_the_cache_is_not_transposed_twice_on_its_way_to_custom_sdpa(lowered):
    """``CustomKVCache.update`` returns each cache transposed and ``SDPACustom`` transposes it back: XNNPACK
    would copy the whole cache twice a step. The pair cancels, so custom_sdpa reads update_cache's cache."""
    cancelled = [t for t in lowered.report.transforms if t.transform == "cancel_inverse_permutes"]
    # per layer: q, and the new k and v, transposed on their way in; both caches on their way out
    assert len(cancelled) == 10 and all(t.op == "aten.permute_copy.default" for t in cancelled), cancelled
    ep = lowered.program.exported_program()
    for node in ep.graph.nodes:
        if node.op == "call_function" and "custom_sdpa" in str(node.target):
            k, v = node.args[1], node.args[2]
            assert "permute" not in str(k.target) and "permute" not in str(v.target), (k, v)


class _Permutes(torch.nn.Module):
    def forward(self, x):
        a = x.transpose(1, 2)
        return a.transpose(1, 2) + 1, a.permute(0, 2, 3, 1) * 2  # an inverse pair, and a permute that is not one


def test_only_a_pair_of_permutes_that_undo_each_other_cancels():
    result = edgeplug.lower(_Permutes(), (torch.randn(2, 3, 4, 5),), backend="xnnpack", verify=True)
    assert result.report.verification.passed, result.report.verification.failures()
    cancelled = [t for t in result.report.transforms if t.transform == "cancel_inverse_permutes"]
    assert [(t.removed, t.detail) for t in cancelled] == [(1, "permute [0, 2, 1, 3] of permute [0, 2, 1, 3] of x is x")]


def test_the_custom_op_program_decodes_as_eager_does(lowered, models, prompt):
    v = lowered.report.verification
    assert v.passed, v.failures()
    assert [o.name for o in v.outputs] == [
        "prefill: output 0", "decode 1: output 0", "decode 2: output 0", "decode 3: output 0"
    ]
    g = v.greedy
    assert g.ran and g.first_difference is None and len(g.lowered_ids) == STEPS and len(set(g.lowered_ids)) > 1
    # the custom ops compute what the plain model does: its greedy ids are the same
    plain = copy.deepcopy(models[0])
    ids = []
    with torch.no_grad():
        out = plain(prompt, {"input_pos": torch.arange(SEQ)})
        for k in range(STEPS):
            ids.append(int(out.reshape(-1, out.shape[-1])[-1].argmax()))
            out = plain(torch.tensor([[ids[-1]]]), {"input_pos": torch.tensor([SEQ + k])})
    assert g.lowered_ids == ids


def test_the_pte_reads_the_cache_update_cache_wrote(lowered, prompt):
    """A decode step after the prefill answers otherwise than the same step on a fresh program."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    step = [torch.tensor([[3]]), torch.tensor([SEQ])]
    warm = _load_for_executorch_from_buffer(lowered.buffer)
    warm.forward([prompt, torch.arange(SEQ)])
    after_prefill = warm.forward(step)[0]
    fresh = _load_for_executorch_from_buffer(lowered.buffer).forward(step)[0]
    assert (after_prefill - fresh).abs().max() > 1e-3
