"""Small programs holding the ops the core's canonicalizing rewrites take, and helpers to apply a rewrite.

A backend that chooses rewrites (``edgeplug.plugin.rewrite_pass`` in its passes hook) tests that its
partitioner refuses an op before the rewrite and takes what the rewrite leaves; these are the programs
the core's own rewrite tests use:

``RewriteBlock``
    An RMSNorm's rank-3 mean, key/value heads repeated the way transformers does it (unsqueeze, expand,
    reshape), scalar ops and a squeeze; ``block_inputs`` gives its inputs.
``RewritePieces``
    A fused projection split in pieces, a state-space scan's selects, a cat of one tensor
    (``block_inputs`` too).
``RotaryAttention``
    rotate_half on a symbolic-length tensor and masked scaled-dot-product attention over a static cache
    (the safe softmax export writes); ``attention_inputs`` (for a sequence length) and
    ``attention_program`` (exported with a dynamic sequence length); ``rotate_half`` is the rotation it uses.

``edge_program`` exports and runs ``to_edge``; ``op_counts`` counts a program's ops by name;
``rewritten`` applies one rewrite to a copy. torch and executorch load when this module is imported.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import torch
from executorch.exir import EdgeCompileConfig, to_edge
from torch import nn

from edgeplug.plugin import apply_rewrite, op_name

__all__ = [
    "RewriteBlock",
    "RewritePieces",
    "RotaryAttention",
    "attention_inputs",
    "attention_program",
    "block_inputs",
    "edge_program",
    "op_counts",
    "rewritten",
    "rotate_half",
]


class RewriteBlock(nn.Module):
    """One of each op the rewrites take: an RMSNorm's rank-3 mean, key/value heads repeated the
    way transformers does it (unsqueeze, expand, reshape), scalar ops, a squeeze."""

    def __init__(self, scale: float = 0.5) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        heads = n.view(b, s, 2, d // 2).transpose(1, 2)
        kv = heads[:, :, None].expand(b, 2, 3, s, d // 2).reshape(b, 6, s, d // 2)
        kv = torch.ops.aten.mul.Scalar(kv, self.scale)
        kv = torch.ops.aten.sub.Scalar(kv, 0.25)
        return kv.squeeze(0)


class RewritePieces(nn.Module):
    """A fused projection split in pieces (phi3's qkv), a state-space scan's selects, a cat of one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = x.split([8, 16, 8], dim=-1)
        steps = [x[:, i] * 2 for i in range(3)]
        return torch.cat([q * v], dim=-1) + k[..., :8] + sum(steps)[:, None, :8]


def block_inputs(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor]:
    """Seeded inputs of ``RewriteBlock`` and ``RewritePieces``: one tensor of shape (1, 8, 32)."""
    return (torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(0)).to(dtype),)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """transformers' rotary helper: the two halves of the last dimension swapped, the first negated."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryAttention(nn.Module):
    """Rotary q and k (rotate_half on a symbolic-length tensor) and masked attention over a static cache
    length: a causal mask from the positions, with rows masked entirely where ``pos`` is negative."""

    def __init__(self, cache: int = 16, head: int = 8) -> None:
        super().__init__()
        self.register_buffer("keys", torch.randn(1, 2, cache, head))
        self.register_buffer("values", torch.randn(1, 2, cache, head))

    def forward(self, q: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        q = q * 0.5 + rotate_half(q) * 0.25
        k = self.keys + rotate_half(self.keys)  # static: symbolic_only leaves it
        mask = torch.arange(self.keys.shape[2])[None, :] <= pos[:, None]  # [s, cache]
        return nn.functional.scaled_dot_product_attention(q, k, self.values, attn_mask=mask)


def attention_inputs(s: int, *, all_masked: int = 0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded ``(q, pos)`` of ``RotaryAttention`` for sequence length ``s``; the first ``all_masked`` rows
    see no key (the safe softmax gives them 0)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, s, 8, generator=g) * 4
    pos = torch.randint(0, 16, (s,), generator=g)
    pos[:all_masked] = -1
    return q, pos


def edge_program(model: nn.Module, inputs: tuple, dynamic_shapes: Any = None) -> Any:
    """``torch.export`` then ``to_edge`` (IR validity unchecked): the edge dialect ``ExportedProgram``."""
    ep = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()


def attention_program(model: nn.Module, inputs: tuple, dynamic: bool = True) -> Any:
    """``RotaryAttention``'s edge program, exported without grad and (``dynamic``) with a sequence length
    from 1 to 16."""
    seq = torch.export.Dim("seq", min=1, max=16)
    with torch.no_grad():
        return edge_program(model, inputs, ({2: seq}, {0: seq}) if dynamic else None)


def op_counts(ep: Any) -> Counter:
    """How many times each op (``aten.add.Tensor``, ...) is called in an exported program's graph."""
    return Counter(op_name(n) for n in ep.graph_module.graph.nodes if n.op == "call_function")


def rewritten(ep: Any, name: str, **params: Any) -> tuple[Any, list]:
    """(a copy of ``ep`` with the rewrite ``name`` applied with ``params``, the records it returned);
    ``ep`` is left as it was."""
    after = copy.deepcopy(ep)
    return after, apply_rewrite(after, name, **params)
