"""The xnnpack backend's partitioner filter: refuse with a reason the report shows.

A filter sees every node the backend's partitioner would take (``ctx.stage ==
"partition"``, edge ops such as ``exir_ops.edge.aten.div.Tensor``) and every
kept-whole aten node before decomposition (``"before_decomposition"``,
``torch.ops.aten...``). It answers None (no opinion), True, False, or
``edgeplug.plugin.refuse("why")`` to refuse with its own reason.
"""

from __future__ import annotations

from typing import Any, Optional

NAME = "xnnpack-no-float64"


def no_float64(node: Any, ctx: Any) -> Optional[Any]:
    """XNNPACK computes in float32 (or lower); a float64 node is refused, so it runs on the CPU in float64."""
    import torch

    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and val.dtype == torch.float64:
        from edgeplug.plugin import refuse

        return refuse("XNNPACK computes in float32 or lower; this node's output is float64, so it stays on the CPU")
    return None
