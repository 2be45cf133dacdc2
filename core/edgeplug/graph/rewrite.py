"""Replacing one node by the aten graph a Python function traces to.

Backend passes that decompose an op (roll, remainder, an autocast region)
write the decomposition as plain torch code; ``replace_with_traced`` traces
it with ``make_fx`` on the node's fake values and splices the result into the
graph in place of the node. New nodes are named through the graph's
namespace, so run it under the pass runner (or after ``reserve_node_names``):
that is what keeps their names from colliding with names torch.export
assigned.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

import torch
from torch.fx.experimental.proxy_tensor import make_fx

_COPIED_META = ("nn_module_stack", "stack_trace", "source_fn_stack", "from_node")


def _fake_mode(values: Sequence[Any]) -> Any:
    from torch._guards import detect_fake_mode

    return detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)])


def replace_with_traced(node: torch.fx.Node, fn: Callable[..., Any], operands: Sequence[Any]) -> list[torch.fx.Node]:
    """Replace ``node`` by the graph of ``fn(*operands)`` and return the new nodes.

    ``operands`` are graph nodes (traced as inputs, through their
    ``meta["val"]``) or Python values (baked into the trace). ``fn`` returns a
    tensor, or a tuple of tensors when ``node``'s users take items from it.
    """
    graph = node.graph
    positions = [i for i, a in enumerate(operands) if isinstance(a, torch.fx.Node)]
    values = []
    for i in positions:
        val = operands[i].meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise ValueError(
                f"cannot decompose {node.name!r}: operand {operands[i].name!r} has no tensor "
                "meta['val'] (run the pass on an exported program)"
            )
        values.append(val)

    def traced(*tensors: torch.Tensor) -> Any:
        args = list(operands)
        for i, t in zip(positions, tensors):
            args[i] = t
        return fn(*args)

    mode = _fake_mode(values)
    if mode is not None:
        with mode:
            sub = make_fx(traced, tracing_mode="real")(*values)
    else:
        sub = make_fx(traced, tracing_mode="fake", _allow_non_fake_inputs=True)(*values)

    env: dict[torch.fx.Node, Any] = {}
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    for ph, i in zip(placeholders, positions, strict=True):
        env[ph] = operands[i]
    created: list[torch.fx.Node] = []
    result: Any = None
    with graph.inserting_before(node):
        for n in sub.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                result = torch.fx.node.map_arg(n.args[0], env.__getitem__)
                continue
            if n.op != "call_function":
                raise NotImplementedError(
                    f"decomposing {node.name!r} traced a {n.op} node ({n.target}); only op calls "
                    "can be spliced (create tensor constants outside the decomposition)"
                )
            new = graph.node_copy(n, env.__getitem__)
            for key in _COPIED_META:
                if key in node.meta:
                    new.meta[key] = node.meta[key]
            env[n] = new
            created.append(new)
    _replace_uses(node, result)
    return created


def _replace_uses(node: torch.fx.Node, result: Any) -> None:
    graph = node.graph
    if isinstance(result, (tuple, list)):
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(result[user.args[1]])
                graph.erase_node(user)
            else:
                raise NotImplementedError(
                    f"{user.name!r} uses the tuple {node.name!r} returns other than by item"
                )
    else:
        node.replace_all_uses_with(result)
    graph.erase_node(node)
