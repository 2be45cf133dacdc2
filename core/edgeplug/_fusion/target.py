"""The op a ``FusionPolicy`` emits, resolved against torch's op registry.

The core knows no fused op by name: a policy names its ``target``
(``namespace.name``), the order of its ``arguments``, and how to make the
op resolvable (``load_target``, e.g. importing a library of custom ops).
``check_policy`` runs when the plugin loads; ``resolve_target`` when a
program is fused, in the program's dialect (aten or edge).

It sits below the registry (it needs only the records, and torch when a
policy is checked), so the registry validates policies at load without
importing the fusion package, which is above the partitioner and the backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from edgeplug._records import FusionPolicy

if TYPE_CHECKING:
    import torch

#: what each argument role accepts, by the schema type's text
_ARGUMENT_TYPES = {
    "input": ("Tensor",),
    "normalized_shape": ("List[int]", "List[SymInt]"),
    "weight": ("Tensor", "Optional[Tensor]"),
    "eps": ("float", "Optional[float]"),
}


class PolicyTargetError(ValueError):
    """A policy's target cannot be resolved or does not take its arguments."""


@dataclass(frozen=True)
class FusedOp:
    """A policy's target in one dialect, and how to call it."""

    policy: FusionPolicy
    #: the op overload to call (an ``EdgeOpOverload`` in an edge program)
    op: Any
    #: the schema takes None for "no weight"; otherwise a weight of ones is passed
    weight_optional: bool

    @property
    def unit_weight_is_ones(self) -> bool:
        """A norm fused without a weight of its own gets a constant of ones: the schema requires a
        weight, or the policy's kernel reads one whatever the schema says (``weightless="ones"``)."""
        return not self.weight_optional or self.policy.weightless == "ones"

    def args(self, *, input: Any, dim: int, weight: Any, eps: float) -> tuple[Any, ...]:
        """The fused op's arguments, in the policy's order."""
        values = {"input": input, "normalized_shape": [dim], "weight": weight, "eps": eps}
        return tuple(values[a] for a in self.policy.arguments)


def _overload(policy: FusionPolicy) -> torch._ops.OpOverload:
    import torch  # when a policy is checked, not when the registry is imported (`import edgeplug` stays light)

    if policy.load_target is not None:
        try:
            policy.load_target()
        except Exception as exc:
            raise PolicyTargetError(f"its load_target ({policy.load_target!r}) raised {exc!r}") from exc
    parts = policy.target.split(".")
    if len(parts) == 3 and parts[2] == "default":
        parts = parts[:2]
    if len(parts) != 2 or not all(parts):
        raise PolicyTargetError(f"target {policy.target!r} is not written namespace.name (e.g. 'aten.rms_norm')")
    try:
        return getattr(getattr(torch.ops, parts[0]), parts[1]).default
    except (AttributeError, RuntimeError) as exc:
        hint = " (give load_target, a function that imports the library registering it)" if policy.load_target is None else ""
        raise PolicyTargetError(f"target {policy.target!r} is not a registered operator{hint}") from exc


def _check_schema(policy: FusionPolicy, op: torch._ops.OpOverload) -> bool:
    """The schema takes the policy's arguments in order; returns whether its weight is optional."""
    schema = op._schema.arguments
    if len(policy.arguments) > len(schema) or any(not a.has_default_value() for a in schema[len(policy.arguments) :]):
        raise PolicyTargetError(f"{op._schema} does not take the policy's arguments {policy.emits}; fix FusionPolicy.arguments")
    weight_optional = False
    for role, arg in zip(policy.arguments, schema):
        if str(arg.type) not in _ARGUMENT_TYPES[role]:
            raise PolicyTargetError(
                f"argument {arg.name!r} of {op._schema} is {arg.type}, but the policy passes the {role} there "
                f"({policy.emits}); fix FusionPolicy.arguments"
            )
        weight_optional = weight_optional or (role == "weight" and str(arg.type).startswith("Optional"))
    return weight_optional


def check_policy(policy: FusionPolicy) -> None:
    """Raise ``PolicyTargetError`` if the policy's target cannot be emitted as it says."""
    _check_schema(policy, _overload(policy))


def resolve_target(policy: FusionPolicy, dialect: Optional[str] = None) -> FusedOp:
    """The policy's op in ``dialect`` ("EDGE" for edge programs, else aten)."""
    op = _overload(policy)
    weight_optional = _check_schema(policy, op)
    if dialect == "EDGE":
        from edgeplug._executorch import edge_dialect_ops  # executorch: seconds; `import edgeplug` loads this module

        ns, name = op._schema.name.split("::")
        op = getattr(getattr(edge_dialect_ops(), ns), name).default
    return FusedOp(policy, op, weight_optional)

