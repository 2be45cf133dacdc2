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
