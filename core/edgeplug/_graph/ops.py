"""Small facts about node targets, the same for aten and edge dialect graphs.

Edge-dialect targets (``EdgeOpOverload``) wrap an aten ``OpOverload`` in
``_op``; every helper here looks through that wrapper, so analyses written
against aten ops also work on ``to_edge(...).exported_program()``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch


def edge_ops() -> Any:
    """executorch's edge-dialect op namespace (``exir_ops.edge``): ``edge_ops().aten.add.Tensor``."""
    # executorch: seconds to import, and only edge programs need it (transform and quantize work on aten)
    from edgeplug import _executorch

    return _executorch.edge_dialect_ops()


def aten_overload(target: Any) -> Any:
    """The ``OpOverload`` behind an edge op, or ``target`` itself."""
    if isinstance(target, torch._ops.OpOverload):
        return target
    from edgeplug._executorch import inner_aten_op  # imports nothing of executorch's

    inner = inner_aten_op(target)
    return inner if isinstance(inner, torch._ops.OpOverload) else target


def op_schema(target: Any) -> Optional[torch.FunctionSchema]:
    return getattr(aten_overload(target), "_schema", None)


def qualified_name(target: Any) -> str:
    """``"aten::clone"``, ``"dim_order_ops::_to_dim_order_copy"``, or ``""``."""
    schema = op_schema(target)
    return schema.name if schema is not None else ""


def base_name(target: Any) -> str:
    """The op name without namespace and overload: ``"clone"``."""
    return qualified_name(target).split("::")[-1]


def is_random(target: Any) -> bool:
    """The op draws from an RNG (``rand``, ``randn_like``, ``dropout``, ...)."""
    op = aten_overload(target)
    if isinstance(op, torch._ops.OpOverload):
        return torch.Tag.nondeterministic_seeded in op.tags
    return bool(getattr(op, "_nondeterministic_seeded", False))


def op_name(target: Any) -> str:
    """A short, stable name for an op: ``"aten.linear.default"``.

    Takes a target (aten, edge or custom op; ``operator.getitem`` gives
    ``"getitem"``) or a node: a ``call_function`` node is named by its
    target, any other node by its kind (``"placeholder"``, ``"output"``).
    This is the name reports, records and kernel lookups use.
    """
    if isinstance(target, torch.fx.Node):
        if target.op != "call_function":
            return target.op
        node, target = target, target.target
        if str(getattr(target, "__name__", "")).startswith("auto_functionalized") and node.args:
            # a functionalized in-place custom op (``llama::update_cache``): name the op it runs
            return f"{target.__name__}({op_name(node.args[0])})"
    schema = op_schema(target)
    if schema is None:
        return getattr(target, "__name__", None) or str(target)
    overload = getattr(aten_overload(target), "_overloadname", "") or "default"
    return f"{schema.name.replace('::', '.')}.{overload}"


def _call_target(target: Any) -> Any:
    if isinstance(target, torch.fx.Node):
        return target.target if target.op == "call_function" else None
    return target


def is_dequantize(target: Any) -> bool:
    """Any dequantize op (``quantized_decomposed``, ``torchao`` or ``aten``); a target or a node."""
    return base_name(_call_target(target)).startswith("dequantize")


_QDQ_PREFIXES = ("quantize", "dequantize", "choose_qparams")


def is_qdq(target: Any) -> bool:
    """A quantization primitive: quantize, dequantize or choose_qparams, of any
    namespace (``quantized_decomposed``, ``torchao``, ``aten``); a target or a node."""
    return base_name(_call_target(target)).startswith(_QDQ_PREFIXES)


#: In-place ops that change metadata only (export writes ``detach_`` after
#: ``lift_fresh_copy``); they do not change the value a node holds.
_METADATA_ONLY_INPLACE = frozenset({"aten::detach_", "aten::requires_grad_"})


def written_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The node arguments an op writes in place (its ``Tensor(a!)`` arguments)."""
    if node.op != "call_function":
        return []
    schema = op_schema(node.target)
    if schema is None or not schema.is_mutable or schema.name in _METADATA_ONLY_INPLACE:
        return []
    out: list[torch.fx.Node] = []
    for i, arg in enumerate(schema.arguments):
        info = arg.alias_info
        if info is None or not info.is_write:
            continue
        value = node.args[i] if i < len(node.args) and not arg.kwarg_only else node.kwargs.get(arg.name)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, torch.fx.Node):
                out.append(v)
    return out


def aliases_first_arg(node: torch.fx.Node) -> bool:
    """The op's output is (a view of) its first argument: view, transpose, add_, ..."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    schema = op_schema(node.target)
    if schema is None or not schema.returns or not schema.arguments:
        return False
    ret, first = schema.returns[0].alias_info, schema.arguments[0].alias_info
    return ret is not None and first is not None and bool(set(ret.before_set) & set(first.before_set))


def view_base(node: torch.fx.Node) -> torch.fx.Node:
    """Follow ops whose output aliases their first input back to the tensor they alias."""
    while aliases_first_arg(node):
        node = node.args[0]
    return node


def is_written(node: torch.fx.Node) -> bool:
    """Some op writes ``node``'s value in place, directly or through a view of it.

    Local: visits only the users of ``node`` and of its views.
    """
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        for user in n.users:
            if n in written_args(user):
                return True
            if aliases_first_arg(user) and user.args[0] is n:
                stack.append(user)
    return False


def dtype_name(dt: Optional[torch.dtype]) -> str:
    """``float32`` for ``torch.float32``; ``?`` where the dtype is unknown."""
    return str(dt).replace("torch.", "") if dt is not None else "?"
