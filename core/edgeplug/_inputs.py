"""Example inputs as people pass them: positional ``args`` and keyword ``kwargs``, checked once.

``lower`` and ``quantize`` take ``args`` (a tuple of the model's positional
inputs, or one tensor, which is one input) and ``kwargs`` (a dict of keyword
inputs), as ``torch.export.export`` does. A dict given as ``args`` is refused
rather than guessed at: it may be the model's keyword inputs or one positional
input that is a dict, and the two lower to different programs.

Leaves may be tensors, ``None``, and the Python scalars ``torch.export`` takes
(bool, int, float, str); the runtime receives every leaf, ``None`` included, in
the order of the program's in-spec (``runtime_inputs``), as the ``.pte``
expects them. Imports torch only inside its functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import TensorArgument

from edgeplug._errors import EdgeplugError, VerificationError

#: leaf types torch.export takes as inputs besides tensors (specialized into the program)
_SCALARS = (bool, int, float, str)


@dataclass(frozen=True)
class ExampleInputs:
    """The inputs one call of the model takes: ``model(*args, **kwargs)``."""

    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """e.g. ``args (Tensor(1, 8), None), kwargs {cache_position: Tensor(8)}``."""
        parts = [f"args ({', '.join(_describe_value(a) for a in self.args)}{',' if len(self.args) == 1 else ''})"]
        if self.kwargs:
            parts.append("kwargs {" + ", ".join(f"{k}: {_describe_value(v)}" for k, v in self.kwargs.items()) + "}")
        return ", ".join(parts)


def _describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).replace("torch.", "")
        return f"Tensor({', '.join(str(d) for d in value.shape)}; {dtype})"
    if isinstance(value, (tuple, list)):
        return type(value).__name__ + "(" + ", ".join(_describe_value(v) for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_describe_value(v)}" for k, v in value.items()) + "}"
    return repr(value) if value is None or isinstance(value, _SCALARS) else type(value).__name__


def _what(value: Any) -> str:
    kind = type(value)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    shown = isinstance(value, (tuple, list, dict, *_SCALARS)) or value is None
    return f"{name} {_describe_value(value)}" if shown else name


def example_inputs(args: Any, kwargs: Any, *, where: str = "edgeplug.lower") -> ExampleInputs:
    """Check and normalize what the caller passed as ``args`` and ``kwargs``.

    A bare tensor is one input; a list is taken as the tuple it would be.
    Raises ``EdgeplugError`` naming what was given for anything else; ``where``
    starts each message (the call, or the model file that returned the inputs).
    """
    if isinstance(args, torch.Tensor):
        args = (args,)  # one input, never a sequence of its rows
    elif isinstance(args, list):
        args = tuple(args)
    elif isinstance(args, dict):
        keys = ", ".join(repr(k) for k in args) or "none"
        raise EdgeplugError(
            f"{where}: args is a dict (keys {keys}), but args holds the model's positional inputs. Pass "
            f"keyword inputs as kwargs={{{next(iter(args), 'name')!r}: ...}}, or a dict the model takes as "
            "one positional input inside a tuple: args=({...},)"
        )
    elif not isinstance(args, tuple):
        raise EdgeplugError(
            f"{where}: args must be a tuple of the model's positional inputs (or one tensor), not {_what(args)}"
        )
    if kwargs is None:
        kwargs = {}
    elif not isinstance(kwargs, dict):
        raise EdgeplugError(f"{where}: kwargs must be a dict of keyword inputs (name -> value), not {_what(kwargs)}")
    bad = [k for k in kwargs if not isinstance(k, str)]
    if bad:
        raise EdgeplugError(f"{where}: kwargs keys must be argument names (str), not {bad[0]!r}")
    _check_leaves(args, kwargs, where)
    return ExampleInputs(args=args, kwargs=dict(kwargs))


def _check_leaves(args: tuple, kwargs: dict, where: str) -> None:
    for label, tree in (("args", args), ("kwargs", kwargs)):
        for path, leaf in pytree.tree_flatten_with_path(tree)[0]:
            if leaf is None or isinstance(leaf, (torch.Tensor, *_SCALARS)):
                continue
            hint = " (torch.from_numpy(...) makes it a tensor)" if type(leaf).__module__ == "numpy" else ""
            raise EdgeplugError(
                f"{where}: {label}{pytree.keystr(path)} is a {_what(leaf)}{hint}; example inputs are tensors, "
                "None, Python scalars, and tuples, lists and dicts of them (or a type registered with "
                "torch.utils._pytree)"
            )


def check_against_program(ep: Any, given: ExampleInputs, *, where: str = "edgeplug.lower") -> None:
    """Refuse inputs whose structure is not the one ``ep`` (an ExportedProgram) was exported with."""
    in_spec = ep.call_spec.in_spec
    if in_spec is None:
        return
    expected = _signature(in_spec)
    try:
        _, spec = pytree.tree_flatten(_ordered(given, in_spec))
    except EdgeplugError:
        spec = None
    if spec == in_spec:
        _check_tensor_types(ep, given, in_spec, where)
        return
    detail = ""
    takes = _program_inputs(ep, in_spec)
    if takes is not None:  # the whole structure, and the leaves one has that the other lacks
        want = {pytree.keystr(p) for p, _ in pytree.tree_flatten_with_path((takes.args, takes.kwargs))[0]}
        have = {pytree.keystr(p) for p, _ in pytree.tree_flatten_with_path((given.args, given.kwargs))[0]}
        diff = [f"missing {_path_words(p)}" for p in sorted(want - have)]
        diff += [f"{_path_words(p)} is not one of its inputs" for p in sorted(have - want)]
        detail = f". The program's inputs: {takes.describe()}" + (f"; {', '.join(diff)}" if diff else "")
    raise EdgeplugError(
        f"{where}: the ExportedProgram takes {expected}, but the example inputs are "
        f"{given.describe()}. Pass the inputs it was exported with (same positions, same keywords, same "
        f"nesting); keyword inputs go in kwargs{detail}"
    )


def _path_words(keystr: str) -> str:
    """``[0][1]['input_pos']`` (a path into ``(args, kwargs)``) -> ``args[1]['input_pos']``."""
    head, rest = keystr[:3], keystr[3:]
    return ("args" if head == "[0]" else "kwargs") + rest


def _program_inputs(ep: Any, in_spec: Any) -> Optional[ExampleInputs]:
    """What ``ep`` takes, as example inputs of its structure (its fake tensors and constants as leaves)."""
    specs = [s for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    if len(specs) != in_spec.num_leaves:
        return None
    vals = {n.name: n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"}
    leaves = [vals.get(s.arg.name) if isinstance(s.arg, TensorArgument) else getattr(s.arg, "value", None) for s in specs]
    try:
        args, kwargs = pytree.tree_unflatten(leaves, in_spec)
    except (TypeError, ValueError):
        return None
    return ExampleInputs(tuple(args), dict(kwargs))


def _check_tensor_types(ep: Any, given: ExampleInputs, in_spec: Any, where: str) -> None:
    """Refuse a tensor input whose dtype, rank or static size is not the one ``ep`` was exported with: the
    structure alone passes an int32 ``input_pos`` where the program takes int64, which executorch's
    runtime then refuses without saying which input (``0x12``, InvalidArgument)."""
    names = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    leaves = pytree.tree_flatten_with_path(_ordered(given, in_spec))[0]
    if len(names) != len(leaves):
        return
    vals = {n.name: n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"}
    for name, (path, leaf) in zip(names, leaves):
        want = vals.get(name)
        if not isinstance(leaf, torch.Tensor) or not isinstance(want, torch.Tensor):
            continue
        static = [(d, int(w)) for d, w in enumerate(want.shape) if isinstance(w, int)]
        bad_size = [(d, w) for d, w in static if leaf.dim() == want.dim() and leaf.shape[d] != w]
        if leaf.dtype == want.dtype and leaf.dim() == want.dim() and not bad_size:
            continue
        if leaf.dtype != want.dtype:
            what = f"dtype {str(leaf.dtype).replace('torch.', '')}, not {str(want.dtype).replace('torch.', '')}"
        elif leaf.dim() != want.dim():
            what = f"{leaf.dim()} dimensions, not {want.dim()}"
        else:
            what = f"size {leaf.shape[bad_size[0][0]]} at dimension {bad_size[0][0]}, not {bad_size[0][1]}"
        label = "args" + pytree.keystr(path[1:]) if path[0].idx == 0 else "kwargs" + pytree.keystr(path[1:])
        shown = ", ".join(str(w) for w in want.shape)
        raise EdgeplugError(
            f"{where}: {label} has {what}: the ExportedProgram's input {name!r} is "
            f"Tensor({shown}; {str(want.dtype).replace('torch.', '')}). Pass inputs of the dtypes and sizes it "
            "was exported with (its .pte refuses others at run time)"
        )


def inputs_for(source: Any, args: Any, kwargs: Any, dynamic_shapes: Any, *, where: str) -> ExampleInputs:
    """``example_inputs`` for ``source`` (a module or an ExportedProgram), checked before any work:
    against the program's in-spec, and ``dynamic_shapes`` (passed to torch.export) only for a module."""
    given = example_inputs(args, kwargs, where=where)
    if isinstance(source, ExportedProgram):
        if dynamic_shapes is not None:
            raise EdgeplugError(
                f"{where}: dynamic_shapes is for a module (it is passed to torch.export); an ExportedProgram "
                "keeps the dynamic dimensions it was exported with: leave dynamic_shapes out"
            )
        check_against_program(source, given, where=where)
    return given


def _signature(in_spec: Any) -> str:
    """What a program's in-spec takes, in words: ``2 positional inputs and keywords input_ids, cache_position``."""
    if in_spec.type is not tuple or in_spec.num_children != 2:
        return "inputs of another structure"
    n = in_spec.child(0).num_children
    keys = list(in_spec.child(1).context or [])
    words = f"{n} positional input{'s' if n != 1 else ''}"
    return words + (f" and keyword inputs {', '.join(keys)}" if keys else " and no keyword inputs")


def _ordered(given: ExampleInputs, in_spec: Any) -> tuple:
    """``(args, kwargs)`` with kwargs in the order of ``in_spec`` (keywords may come in any order)."""
    if in_spec.type is tuple and in_spec.num_children == 2 and in_spec.child(1).type is dict:
        keys = list(in_spec.child(1).context or [])
        if set(keys) == set(given.kwargs):
            return given.args, {k: given.kwargs[k] for k in keys}
    return given.args, given.kwargs


def runtime_inputs(ep: Any, given: ExampleInputs) -> list[Any]:
    """The flat inputs a lowered ``ep`` takes at runtime: every leaf of ``(args, kwargs)`` in its in-spec's
    order, ``None`` and scalars included (the ``.pte``'s method has an input for each)."""
    in_spec = ep.call_spec.in_spec
    tree = _ordered(given, in_spec) if in_spec is not None else (given.args, given.kwargs)
    leaves, spec = pytree.tree_flatten(tree)
    if in_spec is not None and spec != in_spec:
        raise VerificationError(
            f"the inputs ({given.describe()}) do not have the structure the program takes ({_signature(in_spec)})"
        )
    return leaves



def decode_inputs(ep: Any, given: ExampleInputs, count: int, *, sizes_from: Any = None) -> list[ExampleInputs]:
    """``count`` calls that continue ``given`` the way a decoder's next steps do, for a program ``ep``
    (edge or aten) that keeps state in buffers.

    Along each dynamic dimension a step takes the dimension's smallest size
    (at least 1): one token. A 1-D integer input of consecutive values
    (``cache_position``) continues after its last value; any other tensor takes
    a slice of the example along its dynamic dimensions (``input_ids``: tokens
    of the prompt); static inputs and non-tensors stay as given. The dynamic
    dimensions and their ranges are read from ``sizes_from`` (default ``ep``):
    the program as exported, whose ranges to_edge may have narrowed. Returns
    ``[]`` when the program's inputs cannot be matched to the example's.
    """
    in_spec = ep.call_spec.in_spec
    leaves = runtime_inputs(ep, given)
    names = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    if in_spec is None or len(names) != len(leaves):
        return []
    shapes = sizes_from if sizes_from is not None else ep
    vals = {n.name: n.meta.get("val") for n in shapes.graph.nodes if n.op == "placeholder"}
    sizes = [_step_sizes(vals.get(name), shapes.range_constraints) for name in names]
    calls = []
    for k in range(count):
        flat = [_step_input(x, dims, k) if isinstance(x, torch.Tensor) else x for x, dims in zip(leaves, sizes)]
        args, kwargs = pytree.tree_unflatten(flat, in_spec)
        calls.append(ExampleInputs(tuple(args), dict(kwargs)))
    return calls


def _step_sizes(val: Any, ranges: Any) -> dict[int, int]:
    """Dynamic dimension -> its size in a decode step (the smallest it may take, at least 1)."""
    out: dict[int, int] = {}
    for d, size in enumerate(getattr(val, "shape", ())):
        if isinstance(size, torch.SymInt):
            r = ranges.get(size.node.expr)
            try:
                low = int(r.lower) if r is not None else 1
            except (TypeError, ValueError):  # a bound that is not a number
                low = 1
            out[d] = max(1, low)
    return out


def _step_input(x: Any, dims: dict[int, int], k: int) -> Any:
    if x.dim() == 1 and not x.is_floating_point() and not x.is_complex() and x.dtype != torch.bool and x.numel():
        if x.numel() == 1 or bool((x.diff() == 1).all()):  # positions: continue after the last one
            n = dims.get(0, x.numel())
            start = x[-1] + 1 + k * n
            return start + torch.arange(n, dtype=x.dtype)
    for d, n in dims.items():
        size = x.shape[d]
        n = min(n, size)
        start = (k * n) % max(size - n + 1, 1)
        x = x.narrow(d, start, n)
    return x.clone()


__all__ = ["ExampleInputs", "check_against_program", "decode_inputs", "example_inputs", "runtime_inputs"]
