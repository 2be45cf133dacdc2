"""The ops fusion creates, in the program's dialect (aten or edge), and how it makes a node: its
value's metadata computed on fake tensors, its other metadata copied from the node it stands for."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.fx import Node
from torch.export import ExportedProgram

from edgeplug._fusion.nodes import shape
from edgeplug._graph.ops import edge_ops
from edgeplug._graph.rewrite import copy_meta, fake_mode_of



class GraphOps:
    """The helper ops fusion creates, in the program's dialect, and how to make a node."""

    def __init__(self, ep: ExportedProgram) -> None:
        self.graph = ep.graph_module.graph
        self.edge = ep.dialect == "EDGE"
        if self.edge:
            ns: Any = edge_ops()
        else:
            ns = torch.ops
        self.mul = ns.aten.mul.Tensor
        self.view = ns.aten.view_copy.default
        self.full = ns.aten.full.default
        self.cast = ns.dim_order_ops._to_dim_order_copy.default if self.edge else ns.aten._to_copy.default
        self.fake_mode = fake_mode_of(self.graph)

    def cast_to(self, node: Node, to: Optional[torch.dtype], like: Optional[Node]) -> Node:
        kwargs: dict[str, Any] = {"dtype": to}
        if self.edge:
            kwargs["dim_order"] = list(range(len(shape(node) or ())))
        return self.call(self.cast, (node,), kwargs, like=like)

    def call(self, target: Any, args: tuple, kwargs: Optional[dict] = None, *, like: Optional[Node], val: Any = None) -> Node:
        kwargs = kwargs or {}
        node = self.graph.call_function(target, args, kwargs)
        node.meta["val"] = val if val is not None else fake_eval(target, args, kwargs, self.fake_mode)
        copy_meta(like, node)
        return node


def fake_eval(target: Any, args: tuple, kwargs: dict, mode: Any) -> Any:
    """The output metadata of ``target(*args)``, computed on the inputs' fake tensors."""

    def meta(a: Any) -> Any:
        return a.meta.get("val") if isinstance(a, Node) else a

    with mode:
        return target(*torch.fx.node.map_aggregate(args, meta), **torch.fx.node.map_aggregate(kwargs, meta))


def like(node: Node) -> Any:
    """A fake tensor of ``node``'s shape, dtype and device (contiguous)."""
    v = node.meta["val"]
    with v.fake_mode:
        return torch.empty_like(v, memory_format=torch.contiguous_format)
