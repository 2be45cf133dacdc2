"""Constant analysis of an ExportedProgram: what is known at AOT, and where it comes from.

``constant_only_nodes(ep)`` is linear in the graph: one scan collects what the
program writes in place, one pass in topological order propagates: a node is
constant-only when every node it reads is, starting from the parameters,
buffers and lifted constants. Two things break the chain: a value written in
place anywhere in the graph (a buffer the program mutates, or anything it
writes through a view) and an op that draws from an RNG.

``weight_source(node, ep)`` names where an operand comes from, which is what a
fusion policy decides on; ``fold_constant(ep, node)`` turns a computed
constant into a real lifted constant of the program; ``lift_constant(ep,
value)`` adds a tensor as a new lifted constant (what folding and the
canonicalizing rewrites both use).
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Optional, Sequence, Union

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, InputSpec, OutputKind, TensorArgument

from edgeplug._graph.names import used_names
from edgeplug._graph.ops import base_name, is_dequantize, is_random, view_base, written_args
from edgeplug._graph.rewrite import fake_mode_of, replace_uses
from edgeplug._records import WeightSource  # one definition, shared with FusionPolicy

_CONSTANT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
_MUTATION_KINDS = (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION)


@dataclass(frozen=True)
class ConstantAnalysis:
    """The result of one pass over a program's top-level graph."""

    #: nodes whose value depends only on parameters, buffers and lifted
    #: constants (the constant placeholders themselves included)
    constant_only: frozenset[torch.fx.Node]
    #: constant placeholders / tensor attributes, and dequantizes of one
    leaves: frozenset[torch.fx.Node]
    #: nodes written in place somewhere in the graph (never constant)
    mutated: frozenset[torch.fx.Node]

    def source(self, node: torch.fx.Node) -> WeightSource:
        if node in self.leaves:
            return "leaf"
        if node in self.constant_only:
            return "computed"
        return "runtime"


def constant_placeholders(ep: ExportedProgram) -> dict[str, InputSpec]:
    """Placeholder name -> its input spec, for parameters, buffers and lifted constants."""
    return {
        s.arg.name: s
        for s in ep.graph_signature.input_specs
        if s.kind in _CONSTANT_KINDS and isinstance(s.arg, TensorArgument)
    }


def constant_value(ep: ExportedProgram, node: torch.fx.Node) -> Optional[torch.Tensor]:
    """The tensor a constant placeholder or ``get_attr`` node stands for, else None."""
    if node.op == "placeholder":
        spec = constant_placeholders(ep).get(node.name)
        if spec is None or spec.target is None:
            return None
        value = ep.state_dict.get(spec.target)
        if value is None:  # lifted constants and non-persistent buffers
            value = ep.constants.get(spec.target)
        return value if isinstance(value, torch.Tensor) else None
    if node.op == "get_attr":
        value = _get_attr(node)
        return value if isinstance(value, torch.Tensor) else None
    return None


def _get_attr(node: torch.fx.Node) -> Any:
    obj: Any = node.graph.owning_module
    for part in str(node.target).split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def mutated_targets(ep: ExportedProgram) -> frozenset[str]:
    """Parameters and buffers the program's outputs write back (functional graphs)."""
    return frozenset(s.target for s in ep.graph_signature.output_specs if s.kind in _MUTATION_KINDS)


def _mutated_nodes(ep: ExportedProgram, graph: torch.fx.Graph) -> set[torch.fx.Node]:
    sig = ep.graph_signature
    targets = mutated_targets(ep)
    by_name = {s.arg.name for s in sig.input_specs if s.target in targets and s.kind in _CONSTANT_KINDS}
    mutated: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op == "placeholder" and node.name in by_name:
            mutated.add(node)
        for arg in written_args(node):
            mutated.add(view_base(arg))
    return mutated


def _deterministic_subgraph(mod: Any) -> bool:
    """A submodule a higher-order op calls: no RNG and no in-place write inside."""
    if not isinstance(mod, torch.fx.GraphModule):
        return True
    for sub in mod.modules():
        if not isinstance(sub, torch.fx.GraphModule):
            continue
        for n in sub.graph.nodes:
            if n.op == "call_function" and (is_random(n.target) or written_args(n)):
                return False
    return True


def analyze_constants(ep: ExportedProgram) -> ConstantAnalysis:
    """One linear pass; see the module docstring for the rules."""
    graph = ep.graph_module.graph
    placeholders = constant_placeholders(ep)
    mutated = _mutated_nodes(ep, graph)
    const: set[torch.fx.Node] = set()
    leaves: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node in mutated:
            continue
        if node.op == "placeholder":
            if node.name in placeholders:
                const.add(node)
                leaves.add(node)
        elif node.op == "get_attr":
            value = _get_attr(node)
            if isinstance(value, torch.Tensor):
                const.add(node)
                leaves.add(node)
            elif isinstance(value, torch.nn.Module) and _deterministic_subgraph(value):
                const.add(node)  # a subgraph a higher-order op runs; its inputs decide
        elif node.op == "call_function":
            if is_random(node.target):
                continue
            if all(a in const for a in node.all_input_nodes):
                const.add(node)
                if is_dequantize(node.target) and node.args and node.args[0] in leaves:
                    leaves.add(node)
    return ConstantAnalysis(frozenset(const), frozenset(leaves), frozenset(mutated))


def constant_only_nodes(ep: ExportedProgram) -> frozenset[torch.fx.Node]:
    """Nodes whose value depends only on parameters, buffers and lifted constants.

    Includes the constant placeholders themselves and ops that read nothing
    (``full``, ``arange`` over literals). Excludes anything written in place
    in the graph (a mutated buffer and what reads it), random ops, and what
    depends on a user input.
    """
    return analyze_constants(ep).constant_only


def weight_source(
    node: torch.fx.Node, ep: ExportedProgram, *, analysis: Optional[ConstantAnalysis] = None
) -> WeightSource:
    """``"leaf"``, ``"computed"`` or ``"runtime"`` (see DESIGN.md, fusion policies).

    ``leaf``: a parameter, buffer or lifted-constant placeholder (or tensor
    attribute), or a dequantize of one. ``computed``: constant-only but
    computed (``1 + w``, ``w.view(...)``). ``runtime``: reads a user input, a
    mutated buffer or a random op. Pass ``analysis=analyze_constants(ep)``
    when asking about many nodes of one program.
    """
    _check_node(node, ep)
    return (analysis or analyze_constants(ep)).source(node)


def _check_node(node: Any, ep: ExportedProgram) -> None:
    if not isinstance(node, torch.fx.Node):
        raise TypeError(f"expected a torch.fx.Node of the program's graph, got {type(node).__name__}")
    if node.graph is not ep.graph_module.graph:
        raise ValueError(
            f"node {node.name!r} is not in this program's top-level graph "
            "(nodes of nested submodules and of other programs are not analysed)"
        )


# folding ---------------------------------------------------------------------


def ancestors(node: torch.fx.Node) -> list[torch.fx.Node]:
    """``node`` and every node it depends on, in graph order."""
    seen: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    return sorted((n for n in seen if n in order), key=order.__getitem__)  # erased nodes left out


def _evaluate(ep: ExportedProgram, nodes: Iterable[torch.fx.Node]) -> dict[torch.fx.Node, Any]:
    env: dict[torch.fx.Node, Any] = {}

    def load(a: Any) -> Any:
        return torch.fx.node.map_arg(a, env.__getitem__)

    with torch.no_grad():
        for n in nodes:
            if n.op in ("placeholder", "get_attr"):
                value = constant_value(ep, n) if n.op == "placeholder" else _get_attr(n)
                if value is None:
                    raise ValueError(f"node {n.name!r} has no constant value in the program")
                env[n] = value
            elif n.op == "call_function":
                try:
                    env[n] = n.target(*load(n.args), **load(n.kwargs))
                except Exception as exc:  # an op that cannot run here: this node is not foldable
                    raise ValueError(f"evaluating {n.name!r} at AOT failed: {exc}") from exc
            else:
                raise ValueError(f"cannot evaluate {n.op} node {n.name!r} at AOT")
    return env


def _unique(candidate: str, taken: set[str]) -> str:
    candidate = re.sub(r"[^0-9a-zA-Z_]", "_", candidate) or "folded"
    if candidate[0].isdigit():
        candidate = f"_{candidate}"
    name, i = candidate, 0
    while name in taken:
        i += 1
        name = f"{candidate}_{i}"
    return name


def _fake(node: torch.fx.Node, value: torch.Tensor) -> Any:
    mode = getattr(node.meta.get("val"), "fake_mode", None) or fake_mode_of(node.graph)
    return mode.from_tensor(value, static_shapes=True)


def _placeholder_fake_mode(graph: torch.fx.Graph) -> Any:
    """The fake mode of the graph's inputs, or None. After executorch's passes a graph's op
    values can come from another mode than its placeholders'; a new input must share theirs
    (passes that gather the inputs' fake tensors assert they have one mode)."""
    for node in graph.find_nodes(op="placeholder"):
        mode = getattr(node.meta.get("val"), "fake_mode", None)
        if mode is not None:
            return mode
    return None


def fold_constant(ep: ExportedProgram, node: torch.fx.Node, name_hint: str = "folded") -> torch.fx.Node:
    """Evaluate the ``computed`` constant ``node`` at AOT and make it a lifted constant.

    The value becomes a ``CONSTANT_TENSOR`` input of ``ep`` (graph signature
    and ``ep.constants`` updated, unique name derived from ``name_hint``), every
    use of ``node`` reads the new placeholder, and nodes left without users
    (including parameters only the folded subgraph read) are removed. Works
    in place on aten and edge dialect programs; returns the new placeholder.
    A ``leaf`` placeholder is returned unchanged; a ``runtime`` node or a
    dequantize of a leaf (folding would drop the quantization) is refused.

    Each call analyses the program and regenerates its code; to fold many
    nodes of one program use ``fold_constants`` (once each).
    """
    return fold_constants(ep, [node], name_hint)[0]


def fold_constants(
    ep: ExportedProgram,
    nodes: Sequence[torch.fx.Node],
    name_hint: Union[str, Sequence[str]] = "folded",
    *,
    errors: Literal["raise", "return"] = "raise",
    dequantize: bool = False,
) -> list[Any]:
    """``fold_constant`` for several nodes: one analysis, one lint and recompile.

    ``name_hint`` is one hint for every node or one per node. Returns the
    placeholder each node became, in order. A node that an earlier fold in
    the batch already removed (it only fed that one) is folded into nothing
    and its entry is None. ``dequantize=True`` also folds a dequantize of a
    constant into its float value (for a backend that reads float weights).

    Every node is checked and evaluated before anything changes. With
    ``errors="raise"`` a node that cannot be folded raises its ValueError and
    the program is left as it was; with ``errors="return"`` that node's entry
    is the ValueError, it stays as it is, and the others are folded.
    """
    hints = [name_hint] * len(nodes) if isinstance(name_hint, str) else list(name_hint)
    if len(hints) != len(nodes):
        raise ValueError(f"fold_constants got {len(nodes)} nodes but {len(hints)} name hints")
    for node in nodes:
        _check_node(node, ep)
    analysis = analyze_constants(ep)
    values = evaluate_constants(ep, nodes, analysis, dequantize)  # refuse before changing anything
    if errors == "raise":
        refused = next((v for v in values if isinstance(v, ValueError)), None)
        if refused is not None:
            raise refused
    out: list[Any] = []
    for node, hint, value in zip(nodes, hints, values):
        if isinstance(value, ValueError):
            out.append(value)
        elif getattr(node, "_erased", False):
            out.append(None)
        elif value is None:
            out.append(node)  # a leaf: already a constant placeholder or attribute
        else:
            out.append(replace_with_constant(ep, node, hint, value))
    ep.graph_module.graph.lint()
    ep.graph_module.recompile()
    return out


def evaluate_constants(
    ep: ExportedProgram, nodes: Sequence[torch.fx.Node], analysis: ConstantAnalysis, dequantize: bool = False
) -> list[Any]:
    """Per node: the tensor it folds to, None for a leaf, or the ValueError saying why it cannot be folded.

    The subgraphs are evaluated together, so what several nodes share is computed once.
    """
    out: list[Any] = []
    computed: list[torch.fx.Node] = []
    for node in nodes:
        source = analysis.source(node)
        try:
            _foldable(node, source, dequantize)
        except ValueError as exc:
            out.append(exc)
            continue
        out.append(None)
        if _evaluated(node, source):
            computed.append(node)
    if not computed:
        return out
    order = {n: i for i, n in enumerate(ep.graph_module.graph.nodes)}
    seen: set[torch.fx.Node] = set()
    stack = list(computed)
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    try:
        env = _evaluate(ep, sorted(seen, key=order.__getitem__))
    except ValueError:
        env = None  # one subgraph cannot be evaluated: find out which, one node at a time
    for i, node in enumerate(nodes):
        if out[i] is not None or not _evaluated(node, analysis.source(node)):
            continue
        try:
            value = env[node] if env is not None else _evaluate(ep, ancestors(node))[node]
            out[i] = _checked_value(node, value)
        except ValueError as exc:
            out[i] = exc
    return out


def _checked_value(node: torch.fx.Node, value: Any) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"node {node.name!r} evaluates to {type(value).__name__}, not a tensor; nothing to fold")
    expected = node.meta.get("val")
    if isinstance(expected, torch.Tensor) and (
        tuple(expected.shape) != tuple(value.shape) or expected.dtype != value.dtype
    ):
        raise ValueError(
            f"folding {node.name!r} produced {tuple(value.shape)} {value.dtype}, but the graph records "
            f"{tuple(expected.shape)} {expected.dtype}; the subgraph is not safe to evaluate at AOT"
        )
    return value.detach().contiguous().clone()


def _evaluated(node: torch.fx.Node, source: WeightSource) -> bool:
    """Folding ``node`` evaluates it (a computed constant, or an allowed dequantize of a leaf)."""
    return source == "computed" or (source == "leaf" and node.op == "call_function")


def _foldable(node: torch.fx.Node, source: WeightSource, dequantize: bool = False) -> None:
    if source == "leaf" and node.op not in ("placeholder", "get_attr") and not dequantize:
        raise ValueError(
            f"node {node.name!r} ({base_name(node.target)}) dequantizes a constant; folding it would "
            "store the weight unquantized. Use it as a leaf weight instead, or pass dequantize=True."
        )
    if source == "runtime":
        raise ValueError(
            f"node {node.name!r} is not a compile-time constant (it depends on a user input, "
            "a buffer the program mutates, or a random op); only 'computed' constants can be folded"
        )


def replace_with_constant(ep: ExportedProgram, node: torch.fx.Node, name_hint: str, value: torch.Tensor) -> torch.fx.Node:
    """Make ``value`` (what ``node`` computes) a lifted constant and remove what only fed ``node``."""
    subgraph = ancestors(node)
    new = lift_constant(ep, value, name_hint, like=node)
    replace_uses(ep, node, new)
    remove_dead(ep, subgraph)
    return new


def lift_constant(
    ep: ExportedProgram, value: torch.Tensor, name_hint: str = "constant", *, like: Optional[torch.fx.Node] = None
) -> torch.fx.Node:
    """Add ``value`` to ``ep`` as a new lifted constant and return its placeholder (no uses yet).

    The placeholder goes after the program's other constant inputs, its
    ``CONSTANT_TENSOR`` input spec at the same index of the graph signature,
    and the tensor into ``ep.constants`` under a unique name derived from
    ``name_hint``. ``like``: a node whose fake mode and provenance the
    placeholder shares. Works in place on aten and edge dialect programs;
    the caller lints and recompiles.
    """
    graph = ep.graph_module.graph
    sig = ep.graph_signature
    taken_targets = set(ep.state_dict) | set(ep.constants) | {s.target for s in sig.input_specs if s.target}
    target = _unique(name_hint, taken_targets)
    taken_names = {n.name for gm in ep.graph_module.modules() if isinstance(gm, torch.fx.GraphModule) for n in gm.graph.nodes}
    ph_name = _unique(f"c_{target}", taken_names | used_names(graph))

    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    kinds = {s.arg.name: s.kind for s in sig.input_specs}
    const_phs = [n for n in placeholders if kinds.get(n.name) in (*_CONSTANT_KINDS, InputKind.CUSTOM_OBJ)]
    if const_phs:
        anchor, index = graph.inserting_after(const_phs[-1]), placeholders.index(const_phs[-1]) + 1
    elif placeholders:
        anchor, index = graph.inserting_before(placeholders[0]), 0
    else:
        anchor, index = graph.inserting_before(next(iter(graph.nodes))), 0
    with anchor:
        new = graph.placeholder(ph_name)
    if new.name != ph_name:  # fx picked another name: keep the signature in step
        ph_name = new.name
    value = value.detach().contiguous()
    mode = _placeholder_fake_mode(graph)
    new.meta["val"] = mode.from_tensor(value, static_shapes=True) if mode is not None else _fake(like or new, value)
    if like is not None and "stack_trace" in like.meta:
        new.meta["stack_trace"] = like.meta["stack_trace"]
    sig.input_specs.insert(index, InputSpec(kind=InputKind.CONSTANT_TENSOR, arg=TensorArgument(name=ph_name), target=target, persistent=None))
    ep.constants[target] = value
    return new


def remove_dead(ep: ExportedProgram, nodes: Iterable[torch.fx.Node]) -> None:
    """Erase those of ``nodes`` left without users, and then what only they read.

    Ops that write an argument in place, user inputs and parameters or
    buffers the program mutates stay; a constant placeholder that goes takes
    its input spec with it, and its tensor (``state_dict`` / ``constants``)
    when no other spec names it.
    """
    graph = ep.graph_module.graph
    specs = constant_placeholders(ep)
    mutated = mutated_targets(ep)
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if n.users or n.graph is not graph or getattr(n, "_erased", False):
            continue
        inputs = n.all_input_nodes
        if n.op in ("call_function", "get_attr"):
            if n.op == "call_function" and n.target is not operator.getitem and written_args(n):
                continue
            graph.erase_node(n)
        elif n.op == "placeholder" and n.name in specs and specs[n.name].target not in mutated:
            spec = specs.pop(n.name)
            graph.erase_node(n)
            ep.graph_signature.input_specs.remove(spec)
            if not any(s.target == spec.target for s in ep.graph_signature.input_specs):
                ep.state_dict.pop(spec.target, None)
                ep.constants.pop(spec.target, None)
        else:
            continue
        stack.extend(inputs)
