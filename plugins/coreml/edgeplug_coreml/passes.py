"""Core ML's export-stage passes: what coremltools reads differently from torch."""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from edgeplug.plugin import aten_overload

_CUMSUM = torch.ops.aten.cumsum.default


def positive_cumsum_dims(ep: ExportedProgram) -> None:
    """``cumsum(x, d)`` with ``d < -1`` as ``cumsum(x, d + x.dim())``.

    coremltools' ``cumsum`` (8.x) takes an axis in ``[-1, rank - 1]`` and
    refuses any other negative one ("axis should be in the range [-1, 4]"),
    which failed the whole Core ML conversion of a Mamba2 block (its segment
    sums scan along ``-2``). The same scan, written with the positive dim.
    """
    for node in ep.graph.nodes:
        if node.op != "call_function" or aten_overload(node.target) is not _CUMSUM:
            continue
        x = node.args[0]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs["dim"]
        val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if not isinstance(dim, int) or dim >= -1 or not isinstance(val, torch.Tensor):
            continue
        if len(node.args) > 1:
            node.args = (x, dim + val.dim(), *node.args[2:])
        else:
            node.kwargs = {**node.kwargs, "dim": dim + val.dim()}
