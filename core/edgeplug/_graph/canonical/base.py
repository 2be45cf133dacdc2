"""What the rewrite families share: the default dtypes, and a slice that makes nothing when it takes all."""

from __future__ import annotations

import torch

from edgeplug._graph.rewrite import NodeBuilder, tensor_of

#: the float dtypes rewrites act on by default: float32 and float16, what XNNPACK's ops take
FLOATS: tuple[torch.dtype, ...] = (torch.float32, torch.float16)


def slice_of(build: NodeBuilder, origin: torch.fx.Node, x: torch.fx.Node, dim: int, start: int, end: int) -> torch.fx.Node:
    """``x[start:end]`` along ``dim`` (``slice_copy`` before ``origin``), or ``x`` itself when that is all of it."""
    size = tensor_of(x).shape[dim]
    return x if (start, end) == (0, size) else build.call(origin, "slice_copy", (x, dim, start, end), "Tensor")


__all__ = ["FLOATS", "slice_of"]
