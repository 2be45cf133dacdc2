"""The family's patches of executorch (in ``edgeplug_vulkan_delegate._executorch``, the family's one module that
reaches into ExecuTorch: ``tests/test_executorch_boundary.py`` holds every other module to that) are undone on
exit, errors included."""

from __future__ import annotations

import pytest


def test_lowering_context_undoes_both_patches_even_on_error():
    import executorch.backends.vulkan.patterns as vk_patterns

    from edgeplug_vulkan_delegate._executorch import lowering_context

    search, entry = vk_patterns.get_all_fusable_subgraphs, vk_patterns.fusable_patterns["rms_norm"]

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with lowering_context():
            assert "rms_norm" not in vk_patterns.fusable_patterns  # executorch's own RMSNorm fusion is off
            assert vk_patterns.get_all_fusable_subgraphs is not search  # the search is memoized
            raise Boom
    assert vk_patterns.get_all_fusable_subgraphs is search
    assert vk_patterns.fusable_patterns["rms_norm"] is entry


def test_pattern_graphs_traced_once_per_process_and_put_back():
    """executorch registers its RoPE pattern functions uncached (their lru_cache wraps them after registration), so
    every partitioning and preprocess traced them again; inside the lowering scope each runs once per process."""
    import torch
    from executorch.backends.vulkan.patterns import fusable_patterns
    from executorch.backends.vulkan.patterns.pattern_registry import PatternEntry

    from edgeplug_vulkan_delegate._executorch import lowering_context

    rope = {name: e.get_graphs_fn for name, e in fusable_patterns.items() if e.get_graphs_fn is not None}
    assert rope, "executorch's Vulkan registry has no pattern graphs any more: pattern_graphs_traced_once can go"
    calls = []

    def traced() -> list:  # a pattern of this test's own, in executorch's real registry: counts its tracings
        calls.append(1)
        return [torch.fx.symbolic_trace(torch.nn.ReLU())]

    fusable_patterns["edgeplug_test_pattern"] = PatternEntry(get_graphs_fn=traced)

    class Boom(Exception):
        pass

    try:
        assert traced()[0] is not traced()[0]  # the function itself traces on every call
        calls.clear()
        with lowering_context():
            first = fusable_patterns["edgeplug_test_pattern"].get_graphs_fn()
            again = fusable_patterns["edgeplug_test_pattern"].get_graphs_fn()
            assert calls == [1] and first[0] is again[0] and first is not again  # the same graphs, a new list
            assert all(fusable_patterns[n].get_graphs_fn is not fn for n, fn in rope.items())
        with pytest.raises(Boom):
            with lowering_context():
                assert fusable_patterns["edgeplug_test_pattern"].get_graphs_fn()[0] is first[0]  # outlives the scope
                raise Boom
        assert calls == [1]
        assert fusable_patterns["edgeplug_test_pattern"].get_graphs_fn is traced  # put back, errors included
        assert all(fusable_patterns[n].get_graphs_fn is fn for n, fn in rope.items())
    finally:
        del fusable_patterns["edgeplug_test_pattern"]
