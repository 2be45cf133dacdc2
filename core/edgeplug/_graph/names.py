"""Node names: keep every name a pass creates unused.

torch.export assigns some node names (placeholders named after the inputs, and
ops it renamed to make room for them: with an input ``mul`` the model's own
``q * 2`` becomes ``mul_1``) by writing ``node.name`` without recording the name
in the graph's namespace. A later pass that creates a node asks the namespace
for a fresh name, may get one of those back, and the graph fails to lint with
``Node redefined name mul!``.

TODO(pytorch#202927): torch.export does not record the node names it assigns.
torch.fx has no public way to reserve a name, so ``reserve_node_names`` writes
the namespace's private name set. This module is the only place edgeplug
touches that state; remove it when the upstream issue is fixed.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Iterator

import torch

from edgeplug._errors import EdgeplugError

UPSTREAM_ISSUE = "https://github.com/pytorch/pytorch/issues/202927"


class NameReservationError(EdgeplugError):
    """torch.fx's private namespace changed shape; the workaround needs updating."""


def _name_set(graph: torch.fx.Graph) -> set[str]:
    namespace = getattr(graph, "_graph_namespace", None)
    names = getattr(namespace, "_used_names", None)
    if not isinstance(names, set):
        raise NameReservationError(
            f"torch {torch.__version__} no longer keeps node names in "
            "torch.fx.Graph._graph_namespace._used_names (a set), which "
            "edgeplug._graph.reserve_node_names writes to work around "
            f"{UPSTREAM_ISSUE}. Check whether that issue is fixed (then the "
            "reservation can go) or update reserve_node_names for this torch."
        )
    return names


def used_names(graph: torch.fx.Graph) -> set[str]:
    """A copy of the names ``graph``'s namespace will not hand out again."""
    return set(_name_set(graph))


def graph_modules(root: torch.nn.Module) -> Iterator[torch.fx.GraphModule]:
    """``root`` and every GraphModule nested in it (autocast regions, cond/map branches)."""
    for mod in root.modules():
        if isinstance(mod, torch.fx.GraphModule):
            yield mod


def reserve_node_names(gm: Any) -> int:
    """Record the name of every node of every GraphModule in ``gm`` as used.

    ``gm`` is a GraphModule or an ExportedProgram. Afterwards a node any pass
    creates gets a name no existing node has. Returns how many names were not
    recorded before (0 once torch.export records its names itself).
    """
    root = gm.graph_module if hasattr(gm, "graph_signature") else gm
    added = 0
    for mod in graph_modules(root):
        names = _name_set(mod.graph)
        for node in mod.graph.nodes:
            if node.name not in names:
                names.add(node.name)
                added += 1
    return added


def name_signature_as_graph(signature: Any, graph: torch.fx.Graph) -> None:
    """Make ``signature`` (an ExportGraphSignature, changed in place) name ``graph``'s nodes.

    Input specs follow the placeholders and output specs the output node's values, position by
    position. Two ways they drift apart, both fixed here: fx's graph copy renames a node whose name
    shadows a Python builtin (nn.Linear's ``input`` becomes ``input_1``) while a copied signature
    keeps ``input``; and a pass that replaces an output node (executorch's SDPA or roll
    decompositions) leaves the old name in the output spec. torch's verifier refuses either.
    """
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    output = next((n for n in reversed(graph.nodes) if n.op == "output"), None)
    outs = output.args[0] if output is not None else ()
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    for specs, nodes in ((signature.input_specs, placeholders), (signature.output_specs, outs)):
        if len(specs) != len(nodes):
            continue  # a count mismatch is a broken program: check_program names it
        for spec, node in zip(specs, nodes):
            name = getattr(spec.arg, "name", None)
            if isinstance(node, torch.fx.Node) and name is not None and name != node.name:
                spec.arg = dataclasses.replace(spec.arg, name=node.name)


def copy_exported_program(ep: Any) -> Any:
    """``copy.deepcopy(ep)`` whose graph signature names the copy's nodes (``name_signature_as_graph``).

    Weights are shared, not copied (a model's weights are most of its memory): each parameter
    becomes a new Parameter on the same storage (its flags can change without changing ``ep``'s),
    and constants the program does not write are the same tensors; buffers are copied."""
    written = set(ep.graph_signature.buffers_to_mutate.values())
    memo: dict[int, Any] = {}
    for t in ep.state_dict.values():
        if isinstance(t, torch.nn.Parameter):
            memo[id(t)] = torch.nn.Parameter(t.detach(), requires_grad=t.requires_grad)
    for name, t in ep.constants.items():
        if name not in written and isinstance(t, torch.Tensor):
            memo.setdefault(id(t), t)
    out = copy.deepcopy(ep, memo)
    name_signature_as_graph(out.graph_signature, out.graph_module.graph)
    return out


def copy_graph(ep: Any) -> Any:
    """A copy of ``ep`` whose graph, signature and constant tables can change, its node names reserved
    (``reserve_node_names``); the tensors are ``ep``'s own (for a rewrite that writes no tensor:
    fusion, ``copy_exported_program`` copies what a pass may write)."""
    graph = copy.deepcopy(ep.graph_module.graph)
    gm = torch.fx.GraphModule(ep.graph_module, graph)
    gm.meta.update(ep.graph_module.meta)
    signature = copy.deepcopy(ep.graph_signature)
    # the copy's node names (fx renames builtins' names; an earlier pass may have replaced an output)
    name_signature_as_graph(signature, graph)
    out = ep._update(gm, signature, state_dict=dict(ep.state_dict), constants=dict(ep.constants))
    reserve_node_names(out.graph_module)
    return out
