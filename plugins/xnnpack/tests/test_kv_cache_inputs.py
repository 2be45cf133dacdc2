"""executorch's own KV-cache Llama (issue 35's regression): its options arrive as a dict inside the
positional args, ``forward(tokens, {"input_pos": pos})``, and its cache writes are
``cache[:, :, pos] = k``. The .pte ran its writes as executorch's in-place ``index_put_``, whose kernel
refused the values torch's setitem gives (leading 1s dropped: ``0x12``, InvalidArgument) at the first
call; here the .pte runs in executorch's runtime, prefill then one-token decode steps, the cache kept
between calls, and the other forms of the same inputs are compared or refused naming the cause.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.utils._pytree as pytree

import edgeplug
from edgeplug import EdgeplugError

SEQ = 8


def _llama():
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    torch.manual_seed(0)
    args = ModelArgs(
        dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=128, max_seq_len=64, max_context_len=64,
        use_kv_cache=True,
    )
    return construct_transformer(args).eval()


@pytest.fixture(scope="module")
def llama():
    model = _llama()
    tokens = torch.randint(0, 128, (1, SEQ), generator=torch.Generator().manual_seed(1))
    return model, tokens, torch.arange(SEQ)


@pytest.fixture(scope="module")
def lowered(llama):
    """The issue's call, as written (static shapes), and with a dynamic length (one-token decode steps)."""
    model, tokens, pos = llama
    seq = torch.export.Dim("seq", min=1, max=63)
    return {
        "static": edgeplug.lower(model, (tokens, {"input_pos": pos}), backend="xnnpack", verify=True),
        "dynamic": edgeplug.lower(
            model, (tokens, {"input_pos": pos}), backend="xnnpack", verify=True,
            dynamic_shapes=({1: seq}, {"input_pos": {0: seq}}),
        ),
    }


def _pte(result):
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    return _load_for_executorch_from_buffer(result.buffer)


def _flat(result, args, kwargs=None):
    """The runtime's inputs, flattened by the program's own in-spec (refusing another structure)."""
    leaves, spec = pytree.tree_flatten((args, kwargs or {}))
    assert spec == result.exported_program.call_spec.in_spec, spec
    return leaves


@pytest.mark.slow
@pytest.mark.parametrize("shapes", ["static", "dynamic"])
def test_the_kv_cache_llama_verifies_on_its_pte_over_prefill_and_decode_steps(lowered, shapes):
    report = lowered[shapes].report
    v = report.verification
    assert v.method == "pte" and v.passed, v.failures()
    assert [o.name for o in v.outputs] == [
        "prefill: output 0", "decode 1: output 0", "decode 2: output 0", "decode 3: output 0"
    ]
    assert all(o.max_abs_diff < 1e-4 for o in v.outputs)
    one_token = "args (Tensor(1, 1; int64), {'input_pos': Tensor(1; int64)})"
    assert (one_token in v.note) == (shapes == "dynamic"), v.note
    # each cache write (k and v of 2 layers) got its values' leading 1 back, and runs in place
    fixed = [t for t in report.transforms if t.transform == "cache_write_values_at_indexed_shape"]
    assert len(fixed) == 4 and all(t.op == "aten.index_put.default" for t in fixed), fixed
    ops = [str(n.target) for n in lowered[shapes].program.exported_program().graph.nodes if n.op == "call_function"]
    assert sum("aten.index_put_.default" in o for o in ops) == 4


def test_the_pte_keeps_its_cache_across_decode_steps_as_eager_does(llama, lowered):
    """Prefill, then tokens at positions 8, 9, 10 through one loaded .pte, against eager doing the same."""
    model, tokens, pos = llama
    result = lowered["dynamic"]
    eager = copy.deepcopy(model)
    module = _pte(result)
    with torch.no_grad():
        got = module.forward(_flat(result, (tokens, {"input_pos": pos})))[0]
        torch.testing.assert_close(got, eager(tokens, {"input_pos": pos}), atol=1e-4, rtol=1e-4)
        for p in (SEQ, SEQ + 1, SEQ + 2):
            token, at = tokens[:, p % SEQ:p % SEQ + 1], torch.tensor([p])
            got = module.forward(_flat(result, (token, {"input_pos": at})))[0]
            torch.testing.assert_close(got, eager(token, {"input_pos": at}), atol=1e-4, rtol=1e-4)
        # the steps read the cache: a fresh program given the last step alone answers otherwise
        alone = _pte(result).forward(_flat(result, (token, {"input_pos": at})))[0]
    assert (alone - got).abs().max() > 1e-3


def test_a_positional_dict_and_keyword_inputs_give_the_same_program(llama, lowered):
    model, tokens, pos = llama
    by_position = lowered["static"]
    by_keyword = edgeplug.lower(model, (tokens,), backend="xnnpack", kwargs={"attn_options": {"input_pos": pos}})
    assert by_keyword.exported_program.call_spec.in_spec != by_position.exported_program.call_spec.in_spec

    def placeholders(result):
        sig = result.exported_program.graph_signature
        names = [s.arg.name for s in sig.input_specs if s.kind.name == "USER_INPUT"]
        vals = {n.name: n.meta["val"] for n in result.exported_program.graph.nodes if n.op == "placeholder"}
        return [(tuple(vals[n].shape), vals[n].dtype) for n in names]

    assert placeholders(by_keyword) == placeholders(by_position) == [((1, SEQ), torch.int64), ((SEQ,), torch.int64)]
    flat = _flat(by_keyword, (tokens,), {"attn_options": {"input_pos": pos}})
    assert [x is y for x, y in zip(flat, by_keyword.runtime_inputs())] == [True, True]
    with torch.no_grad():
        a = _pte(by_position).forward(_flat(by_position, (tokens, {"input_pos": pos})))[0]
        b = _pte(by_keyword).forward(flat)[0]
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    # a plain dict as args: positional or keyword inputs? refused, naming both ways to say it
    with pytest.raises(EdgeplugError, match=re.escape("args is a dict (keys 'tokens', 'attn_options')")):
        edgeplug.lower(model, {"tokens": tokens, "attn_options": {"input_pos": pos}}, backend="xnnpack")


def test_inputs_the_program_does_not_take_are_refused_naming_the_input(llama):
    """An ExportedProgram given inputs of its structure but another dtype or size ran to executorch's
    0x12 at verification; a missing key named no key."""
    model, tokens, pos = llama
    with torch.no_grad():
        ep = torch.export.export(copy.deepcopy(model), (tokens, {"input_pos": pos}))
    cases = [
        ({"input_pos": pos.int()}, "args[1]['input_pos'] has dtype int32, not int64: the ExportedProgram's input "
         "'attn_options_input_pos' is Tensor(8; int64)"),
        ({"input_pos": torch.arange(4)}, "args[1]['input_pos'] has size 4 at dimension 0, not 8"),
        ({}, "The program's inputs: args (Tensor(1, 8; int64), {'input_pos': Tensor(8; int64)}); missing "
         "args[1]['input_pos']"),
    ]
    for options, message in cases:
        with pytest.raises(EdgeplugError, match=re.escape(message)):
            edgeplug.lower(ep, (tokens, options), backend="xnnpack", verify=True)
