"""QNN's export-stage passes: decompositions HTP needs before lowering.

Both add nodes to a program torch.export named, so they rely on the core's
pass runner reserving the names that exist (pytorch#202927): with an input
named ``t_1`` or ``mul``, the nodes they add would otherwise take that name.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram

from edgeplug.plugin import replace_with_traced


def _is_autocast(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, torch._higher_order_ops.wrap.WrapWithAutocast)


def _region(device_type: Any, dtype: Any, enabled: Any, cache_enabled: Any, body: torch.fx.GraphModule):
    def run(*operands: Any) -> Any:
        with torch.autocast(device_type=device_type or "cpu", dtype=dtype, enabled=bool(enabled), cache_enabled=cache_enabled):
            return body(*operands)

    return run


def decompose_autocast(ep: ExportedProgram) -> None:
    """Inline every ``wrap_with_autocast`` region as explicit casts and ops.

    The region's body is retraced under the region's autocast settings, so
    the casts autocast would apply become ``_to_copy`` nodes and the
    program computes what eager does. (executorch 1.5.1's
    ``DecomposeWrapWithAutocast`` maps the body's placeholders by name and
    raises ``KeyError: 'arg0_1'`` on torch 2.13's programs; it also drops the
    casts.)
    """
    gm = ep.graph_module
    for _ in range(64):  # a region can contain regions; they surface when inlined
        nodes = [n for n in gm.graph.nodes if _is_autocast(n)]
        if not nodes:
            return
        for node in nodes:
            device_type, dtype, enabled, cache_enabled, body_ref, *operands = node.args
            body = getattr(gm, body_ref.target)
            replace_with_traced(node, _region(device_type, dtype, enabled, cache_enabled, body), operands)
            if not body_ref.users:
                gm.graph.erase_node(body_ref)
                if not any(n.op == "get_attr" and n.target == body_ref.target for n in gm.graph.nodes):
                    gm.delete_submodule(body_ref.target)
    raise RuntimeError("autocast regions still present after 64 rounds of inlining")


def decompose_sdpa(ep: ExportedProgram) -> None:
    """``scaled_dot_product_attention`` as matmuls and softmax (executorch's pass)."""
    from executorch.backends.transforms.decompose_sdpa import DecomposeScaledDotProductAttention

    if any(n.target is torch.ops.aten.scaled_dot_product_attention.default for n in ep.graph.nodes):
        DecomposeScaledDotProductAttention()(ep.graph_module)
