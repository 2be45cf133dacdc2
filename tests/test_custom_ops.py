"""Programs that call ExecuTorch's LLM custom ops (``llama::update_cache``, ``llama::custom_sdpa``).

ExecuTorch's LLM exports write the KV cache with ``llama::update_cache`` at a
data-dependent position (``input_pos[0].item()``) and attend with
``llama::custom_sdpa``. Such a program carries unbacked symbols, and a
lowering must take it as exported: every stage passes the custom ops through,
a backend that has no kernel for one leaves it on the CPU with a reason naming
the op (the in-place cache update by the op it runs, not as an anonymous
``auto_functionalized_v2``), and the caller's program can be lowered again,
here or by stock ExecuTorch, afterwards.
"""

from __future__ import annotations

import pytest
import torch

import edgeplug

@pytest.fixture(scope="module")
def program():
    from edgeplug.testing.programs import cached_attention

    return cached_attention()


def _pending(ep) -> list:
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode([n.meta["val"] for n in ep.graph.nodes if "val" in n.meta])
    return list(mode.shape_env.pending_fresh_unbacked_symbols)


def test_custom_ops_stay_on_the_cpu_named_and_the_program_lowers_again(program, fixture_backends):
    ep, args = program
    code, pending = ep.graph_module.code, _pending(ep)
    first = edgeplug.lower(ep, args, fixture_backends.TABLE)
    cpu = {c.op: c.reason for c in first.report.cpu_nodes}
    assert "llama.custom_sdpa.default" in cpu and cpu["llama.custom_sdpa.default"], cpu
    assert "auto_functionalized_v2(llama.update_cache.default)" in cpu, sorted(cpu)
    assert first.report.partitions, "the linear layers were not delegated"
    # the caller's program is as it was: same graph, no symbol left pending in its ShapeEnv ...
    assert ep.graph_module.code == code and _pending(ep) == pending
    # ... so a second lowering traces it (it failed with PendingUnbackedSymbolNotFound)
    second = edgeplug.lower(ep, args, fixture_backends.TABLE)
    assert second.report.cpu_ops == first.report.cpu_ops


def test_a_stock_flow_after_a_lowering_still_traces_the_program(fixture_backends):
    from executorch.exir import to_edge

    from edgeplug.testing.programs import _cached_attention_program

    ep, args = _cached_attention_program(32, 2, 16)  # its own program: stock's trace below leaves symbols pending in it
    edgeplug.lower(ep, args, fixture_backends.TABLE, dry_run=True)
    to_edge(ep)  # what a user does next with the same object
    # ... and a lowering after stock's trace still works (edgeplug ignores symbols stock left pending)
    again = edgeplug.lower(ep, args, fixture_backends.TABLE, dry_run=True)
    assert "llama.custom_sdpa.default" in again.report.cpu_ops
