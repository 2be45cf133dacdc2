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
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
from torch.export.graph_signature import TensorArgument
from torch.fx.experimental.proxy_tensor import make_fx

#: metadata a node made in place of another takes from it (where it came from in the model)
COPIED_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node", "debug_handle")


def copy_meta(src: Optional[torch.fx.Node], dst: torch.fx.Node) -> None:
    """Give ``dst`` the provenance metadata (``COPIED_META``) of ``src``."""
    if src is None:
        return
    for key in COPIED_META:
        if key in src.meta:
            dst.meta[key] = src.meta[key]


def detect_fake_mode(values: Iterable[Any]) -> Any:
    """The fake mode of the fake tensors among ``values`` (node values, tensors), or None."""
    from torch._guards import detect_fake_mode as detect

    tensors = [v.meta.get("val") if isinstance(v, torch.fx.Node) else v for v in values]
    return detect([t for t in tensors if isinstance(t, torch.Tensor)])


def fake_mode_of(graph: torch.fx.Graph) -> Any:
    """The fake mode of ``graph``'s node values, or a new one when it has none."""
    mode = detect_fake_mode(graph.nodes)
    if mode is None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode()
    return mode


def replace_uses(ep: Any, old: torch.fx.Node, new: torch.fx.Node) -> None:
    """Every use of ``old`` reads ``new``, the program's outputs (graph signature) included."""
    old.replace_all_uses_with(new)
    specs = ep.graph_signature.output_specs
    for i, spec in enumerate(specs):
        if isinstance(spec.arg, TensorArgument) and spec.arg.name == old.name:
            specs[i] = type(spec)(kind=spec.kind, arg=TensorArgument(name=new.name), target=spec.target)


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

    mode = detect_fake_mode(values)
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
            copy_meta(node, new)
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
