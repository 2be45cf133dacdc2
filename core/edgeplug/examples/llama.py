"""Tiny, deterministic decoder models written in plain torch."""

from __future__ import annotations

import math

import torch
from torch import nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """The hand-written form most model code uses (what backends must recognise)."""

    def __init__(self, dim: int, eps: float = 1e-6, gemma: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.gemma = gemma
        self.weight = nn.Parameter(torch.zeros(dim) if gemma else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        scale = (1.0 + self.weight) if self.gemma else self.weight
        return h * scale


#: the additive causal-mask value (finite, so the examples can be quantized)
MASK_VALUE = -30.0


def _rope(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = q.shape[-1] // 2
    q1, q2 = q[..., :half], q[..., half:]
    return q * cos + torch.cat((-q2, q1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin, mask):
        b, s, d = x.shape
        q = self.wq(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim) + mask
        out = torch.softmax(att, dim=-1) @ v
        return self.wo(out.transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, gemma: bool = False) -> None:
        super().__init__()
        self.gemma = gemma
        self.attn_norm = RMSNorm(dim, gemma=gemma)
        self.attn = Attention(dim, heads)
        self.ffn_norm = RMSNorm(dim, gemma=gemma)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x, cos, sin, mask):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask)
        h = self.ffn_norm(x)
        act = F.gelu(self.w1(h), approximate="tanh") if self.gemma else F.silu(self.w1(h))
        return x + self.w2(act * self.w3(h))


class TinyDecoder(nn.Module):
    """Token embedding, N blocks, final norm, LM head. Positions are buffers."""

    def __init__(self, vocab=128, dim=64, heads=4, hidden=128, layers=2, seq=16, gemma=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, hidden, gemma) for _ in range(layers))
        self.norm = RMSNorm(dim, gemma=gemma)
        self.head = nn.Linear(dim, vocab, bias=False)
        hd = dim // heads
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(seq).float(), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos()[None, None])
        self.register_buffer("sin", ang.sin()[None, None])
        # A finite mask, not -inf: exp(MASK_VALUE) is ~1e-13 of an unmasked score, so the float model
        # computes what -inf would, while a quantizer's observers see a finite range (-inf makes
        # QnnQuantizer's ranges NaN and spreads XNNPACK's over every representable value).
        mask = torch.full((seq, seq), MASK_VALUE).triu(1)
        self.register_buffer("mask", mask[None, None])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        s = tokens.shape[1]
        x = self.embed(tokens)
        cos, sin, mask = self.cos[..., :s, :], self.sin[..., :s, :], self.mask[..., :s, :s]
        for blk in self.blocks:
            x = blk(x, cos, sin, mask)
        return self.head(self.norm(x))


def _init(model: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight") and p.dim() == 1:
                # norm weights: near 1 (or near 0 for Gemma's 1 + w), not exactly
                base = 0.0 if getattr(model, "_gemma", False) else 1.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 / math.sqrt(p.shape[-1])))
    return model.eval()


def tiny_llama(seq: int = 16, layers: int = 2):
    model = TinyDecoder(layers=layers, seq=seq)
    _init(model, seed=0)
    tokens = torch.randint(0, 128, (1, seq), generator=torch.Generator().manual_seed(1))
    return model, (tokens,)


def gemma_style_block(seq: int = 16):
    model = TinyDecoder(layers=1, seq=seq, gemma=True)
    model._gemma = True
    _init(model, seed=2)
    tokens = torch.randint(0, 128, (1, seq), generator=torch.Generator().manual_seed(3))
    return model, (tokens,)


class SmallMlp(nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def small_mlp():
    model = _init(SmallMlp(), seed=4)
    x = torch.randn(2, 32, generator=torch.Generator().manual_seed(5))
    return model, (x,)
