"""Programs the conformance suite lowers besides the built-in examples.

``cached_attention()``: one attention block over a static KV cache, written the
way ExecuTorch's LLM export writes it: the cache is updated in place with
``llama::update_cache`` at a data-dependent position (``input_pos[0].item()``),
and attention is ``llama::custom_sdpa`` (both registered by
``executorch.extension.llm.custom_ops``). The sequence length is dynamic, so
the exported program carries unbacked symbols, as a deployed decoder does.
"""

from __future__ import annotations

from typing import Any

#: the custom ops the program calls, as reports name them (the in-place update through functionalization)
CUSTOM_OPS = ("llama.custom_sdpa.default", "auto_functionalized_v2(llama.update_cache.default)")

_CACHE: dict[str, Any] = {}


def cached_attention(dim: int = 32, heads: int = 2, cache: int = 16) -> tuple[Any, tuple]:
    """``(ExportedProgram, example args)`` of the cached attention block, exported once per process.

    Callers lower the program as it is (a lowering never changes it) and must not mutate it.
    """
    key = f"{dim}x{heads}x{cache}"
    if key not in _CACHE:
        _CACHE[key] = _export(dim, heads, cache)
    return _CACHE[key]


def _export(dim: int, heads: int, cache: int) -> tuple[Any, tuple]:
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (registers llama::*)
    import torch

    class CachedAttention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
            self.out = torch.nn.Linear(dim, dim, bias=False)
            self.register_buffer("k_cache", torch.zeros(1, cache, heads, dim // heads))
            self.register_buffer("v_cache", torch.zeros(1, cache, heads, dim // heads))

        def forward(self, x: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, heads, dim // heads).unbind(2)
            start = input_pos[0].item()
            torch.ops.llama.update_cache(k, self.k_cache, start)
            torch.ops.llama.update_cache(v, self.v_cache, start)
            y = torch.ops.llama.custom_sdpa(q, self.k_cache, self.v_cache, start, None, 0.0, True)
            return x + self.out(y.reshape(b, t, dim))

    torch.manual_seed(0)
    model = CachedAttention().eval()
    args = (torch.randn(1, 4, dim), torch.arange(4))
    seq = torch.export.Dim("seq", min=1, max=cache - 1)
    with torch.no_grad():
        ep = torch.export.export(model, args, dynamic_shapes=({1: seq}, {0: seq}), strict=False)
    return ep, args
