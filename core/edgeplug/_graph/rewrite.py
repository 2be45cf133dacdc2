"""Rewriting nodes: replacing one by the aten graph a Python function traces
to, and the small toolkit the canonical rewrites are written with
(``NodeBuilder``, which makes nodes in a program's dialect with their fake
values; ``note_rewrite``, their ``TransformRecord``; ``tensor_of``,
``is_static``, ``is_plain`` and ``calls_to`` to find what they may change).

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
from torch._guards import detect_fake_mode as torch_detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export import ExportedProgram
from torch.export.graph_signature import TensorArgument
from torch.fx.experimental.proxy_tensor import make_fx

from edgeplug._graph.ops import aten_overload, edge_ops, op_name
from edgeplug._records import TransformRecord

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
    tensors = [v.meta.get("val") if isinstance(v, torch.fx.Node) else v for v in values]
    return torch_detect_fake_mode([t for t in tensors if isinstance(t, torch.Tensor)])


def fake_mode_of(graph: torch.fx.Graph) -> Any:
    """The fake mode of ``graph``'s node values, or a new one when it has none."""
    mode = detect_fake_mode(graph.nodes)
    if mode is None:
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

    mode = detect_fake_mode(values) or _graph_fake_mode(node)
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


def _graph_fake_mode(node: torch.fx.Node) -> Any:
    """The fake mode of ``node``'s program, for a trace with no tensor operand.

    A trace in a fresh mode would give the new nodes values that a later
    pass (fusion's re-trace) cannot mix with the program's own.
    """
    vals = [node.meta.get("val")] + [n.meta.get("val") for n in node.graph.nodes if n.op == "placeholder"]
    return detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])


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


# -- building rewrites: what the canonical rewrites (and a plugin's own) are written with ----


def tensor_of(node: Any) -> Optional[torch.Tensor]:
    """The (fake) tensor a node computes, from its ``meta["val"]``; None for anything else."""
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def is_static(*tensors: Optional[torch.Tensor]) -> bool:
    """Every tensor is known and has only integer sizes (no symbolic dims)."""
    return all(t is not None and all(type(d) is int for d in t.shape) for t in tensors)


def is_plain(t: Optional[torch.Tensor], dtypes: Optional[Sequence[torch.dtype]]) -> bool:
    """A static, contiguous tensor of one of ``dtypes`` (any dtype when None)."""
    return is_static(t) and t.is_contiguous() and (dtypes is None or t.dtype in dtypes)


def view_shape(t: Optional[torch.Tensor]) -> Optional[list[int]]:
    """``t``'s shape as a ``view_copy`` argument: its sizes, the one symbolic size written ``-1``.

    None when more than one size is symbolic or a static size is 0 (``-1`` would not be the one
    size that fits). A view is fixed by the shape it makes, so ``-1`` infers exactly the size the
    symbol has at run time, and partitioners that refuse symbolic view sizes (XNNPACK's) take it.
    """
    if t is None:
        return None
    shape = [d if type(d) is int else -1 for d in t.shape]
    if shape.count(-1) > 1 or 0 in shape:
        return None
    return shape


def is_dense(t: Optional[torch.Tensor], dtypes: Optional[Sequence[torch.dtype]] = None) -> bool:
    """A contiguous tensor of one of ``dtypes`` with at most one symbolic size (see ``view_shape``).

    Contiguity is read from the strides without guarding on a symbol: a stride that is not a
    plain int fails unless it is the product of the sizes after it, as torch writes it.
    """
    if t is None or view_shape(t) is None or (dtypes is not None and t.dtype not in dtypes):
        return False
    expected: Any = 1
    for size, stride in reversed(list(zip(t.shape, t.stride()))):
        if type(size) is int and size == 1:
            continue  # a size-1 dim's stride is never read
        if not (stride == expected if type(stride) is int and type(expected) is int else str(stride) == str(expected)):
            return False
        expected = expected * size
    return True


class NodeBuilder:
    """Makes nodes in a program's dialect, with values computed in the graph's fake mode."""

    def __init__(self, ep: ExportedProgram) -> None:
        self.ep = ep
        self.graph = ep.graph_module.graph
        self.edge = getattr(ep, "dialect", None) == "EDGE"
        self._mode: Any = None

    def _graph_mode(self) -> Any:
        if self._mode is None:
            self._mode = fake_mode_of(self.graph)
        return self._mode

    def op(self, name: str, overload: str = "default") -> Any:
        if self.edge:
            return getattr(getattr(edge_ops().aten, name), overload)
        return getattr(getattr(torch.ops.aten, name), overload)

    def call(
        self, origin: torch.fx.Node, name: str, args: tuple, overload: str = "default", kwargs: Optional[dict] = None
    ) -> torch.fx.Node:
        """A node calling ``aten.<name>.<overload>(*args, **kwargs)`` before ``origin``, with its provenance."""
        return self._make(origin, self.op(name, overload), getattr(getattr(torch.ops.aten, name), overload), args, kwargs or {})

    def same_op(self, origin: torch.fx.Node, args: tuple, kwargs: Optional[dict] = None) -> torch.fx.Node:
        """A node calling ``origin``'s own op (either dialect) with other arguments, before ``origin``."""
        return self._make(origin, origin.target, aten_overload(origin.target), args, dict(kwargs or {}))

    def _make(self, origin: torch.fx.Node, target: Any, fake_op: Any, args: tuple, kwargs: dict) -> torch.fx.Node:
        inputs: list[torch.fx.Node] = []

        def fake(n: torch.fx.Node) -> Any:
            inputs.append(n)
            return n.meta["val"]

        fake_args, fake_kwargs = torch.fx.node.map_arg((args, kwargs), fake)
        # the inputs' own mode: after executorch's passes ops and placeholders may hold different ones
        with detect_fake_mode(inputs) or self._graph_mode():
            val = fake_op(*fake_args, **fake_kwargs)
        with self.graph.inserting_before(origin):
            node = self.graph.call_function(target, args, kwargs)
        node.meta["val"] = val
        copy_meta(origin, node)
        return node

    def cast(self, origin: torch.fx.Node, x: torch.fx.Node, dtype: torch.dtype) -> torch.fx.Node:
        """``x`` converted to ``dtype``: ``_to_copy``, or in an edge program the dim-order form
        ``to_edge`` writes (``dim_order_ops._to_dim_order_copy``, contiguous)."""
        if not self.edge:
            return self.call(origin, "_to_copy", (x,), kwargs={"dtype": dtype})
        target = edge_ops().dim_order_ops._to_dim_order_copy.default
        kwargs = {"dtype": dtype, "dim_order": list(range(tensor_of(x).dim()))}
        return self._make(origin, target, lambda t, **kw: torch.ops.aten._to_copy.default(t, dtype=kw["dtype"]), (x,), kwargs)

    def view(self, origin: torch.fx.Node, x: torch.fx.Node, shape: Sequence[Any]) -> torch.fx.Node:
        """``view_copy(x, shape)``; a symbolic size in ``shape`` (at most one) is written ``-1``."""
        sizes = [d if type(d) is int else -1 for d in shape]
        if sizes.count(-1) > 1:
            raise ValueError(f"NodeBuilder.view at {origin.name}: at most one size may be symbolic or -1, got {list(shape)}")
        return self.call(origin, "view_copy", (x, sizes))

    def replace(self, old: torch.fx.Node, new: torch.fx.Node) -> None:
        replace_uses(self.ep, old, new)
        self.graph.erase_node(old)


def note_rewrite(
    name: str, node: torch.fx.Node, added: int, detail: str, bytes_added: int = 0, removed: int = 1
) -> TransformRecord:
    """The ``TransformRecord`` of rewrite ``name`` replacing ``node`` by ``added`` nodes (``detail`` says how).

    A pass returns the records it made, with its program: ``PassResult(ep, records)``.
    """
    return TransformRecord(
        transform=name, kind="rewrite", node=node.name, op=op_name(node), removed=removed, added=added,
        bytes_added=bytes_added, detail=detail,
    )


def calls_to(ep: ExportedProgram, names: Iterable[str]) -> list[torch.fx.Node]:
    """The call nodes of ``ep`` whose ``op_name`` is one of ``names``, in graph order."""
    wanted = set(names)
    return [n for n in ep.graph_module.graph.nodes if n.op == "call_function" and op_name(n) in wanted]
