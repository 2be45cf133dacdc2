"""The core's attention rewrites (rotate_half_as_matmul, safe_softmax_as_floats) leave only ops XNNPACK's
partitioner configs take where the guards were: checked with executorch's own configs on a real
exported program (the rewrites' exactness and negatives are the core's tests).
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch import nn

from edgeplug._graph.ops import op_name
from edgeplug.plugin import apply_rewrite



def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
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


def _edge(model: nn.Module, inputs: tuple, dynamic: bool = True):
    from executorch.exir import EdgeCompileConfig, to_edge

    seq = torch.export.Dim("seq", min=1, max=16)
    shapes = ({2: seq}, {0: seq}) if dynamic else None
    with torch.no_grad():
        ep = torch.export.export(model, inputs, dynamic_shapes=shapes)
    return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()


def _inputs(s: int, *, all_masked: int = 0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, s, 8, generator=g) * 4
    pos = torch.randint(0, 16, (s,), generator=g)
    pos[:all_masked] = -1  # these rows see no key: the safe softmax gives them 0
    return q, pos


@pytest.fixture(scope="module")
def attention_edge():
    torch.manual_seed(0)
    model = Attention().eval()
    return model, _edge(model, _inputs(5))


def _xnnpack_refuses(ep) -> list[str]:
    """The ops of ``ep`` executorch's XNNPACK partitioner configs refuse (or have no config for)."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS

    configs = {c.target_name: c for c in (cls() for cls in ALL_PARTITIONER_CONFIGS) if hasattr(c, "target_name")}
    refused = []
    for n in ep.graph_module.graph.nodes:
        if n.op == "call_function" and "sym_size" not in op_name(n):
            config = configs.get(op_name(n).removeprefix("aten."))
            if config is None or not config.check_constraints(n, ep):
                refused.append(op_name(n))
    return refused


def test_both_leave_only_ops_xnnpack_takes_where_the_guards_were(attention_edge):
    _, ep = attention_edge
    refused_before = Counter(_xnnpack_refuses(ep))
    after = copy.deepcopy(ep)
    for name in ("rotate_half_as_matmul", "safe_softmax_as_floats", "scalar_to_tensor"):
        apply_rewrite(after, name)
    refused_after = Counter(_xnnpack_refuses(after))
    for op in ("aten.eq.Scalar", "aten.logical_not.default", "aten.any.dim", "aten.full_like.default", "aten.neg.default"):
        assert refused_after[op] == 0, (op, refused_after)
    # the dynamic rotate_half's two slices are gone; the static one (the keys') and the mask's ops stay
    assert refused_before["aten.slice_copy.Tensor"] - refused_after["aten.slice_copy.Tensor"] == 2
    assert sum(refused_after.values()) < sum(refused_before.values()) - 6
