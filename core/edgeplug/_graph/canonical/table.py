"""The core's canonicalizing rewrites by name, and the pass that runs one.

``REWRITES`` is the one table of them (``edgeplug._graph.canonical`` says what
each family does); ``rewrite_pass(name, backend=..., **params)`` is the
``PassSpec`` a backend yields to choose one, and ``apply_rewrite(ep, name,
**params)`` runs one on a program directly and returns its records.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence, Union, cast

from torch.export import ExportedProgram

from edgeplug._graph.canonical import attention, duplicates, elementwise, masks, reductions, scans, shape
from edgeplug._graph.names import reserve_node_names
from edgeplug._graph.passes import PassResult
from edgeplug._records import PassSpec, TransformRecord


@dataclass(frozen=True)
class Rewrite:
    """A named rewrite: ``fn(ep, **params) -> list[TransformRecord]``, changing ``ep`` in place."""

    name: str
    fn: Callable[..., list[TransformRecord]]

    def check(self, params: dict[str, Any]) -> None:
        """Raise TypeError naming the rewrite when ``params`` are not its parameters."""
        try:
            inspect.signature(self.fn).bind(None, **params)
        except TypeError as exc:
            accepted = [p for p in inspect.signature(self.fn).parameters if p != "ep"]
            raise TypeError(f"rewrite {self.name!r} takes {accepted}, got {sorted(params)}: {exc}") from None


REWRITES: dict[str, Rewrite] = {
    # shape
    "unsqueeze_as_view": Rewrite("unsqueeze_as_view", shape.unsqueeze_as_view),
    "squeeze_as_view": Rewrite("squeeze_as_view", shape.squeeze_as_view),
    "symbolic_view_sizes": Rewrite("symbolic_view_sizes", shape.symbolic_view_sizes),
    "collapse_view_chains": Rewrite("collapse_view_chains", shape.collapse_view_chains),
    "cat_distinct_inputs": Rewrite("cat_distinct_inputs", shape.cat_distinct_inputs),
    "drop_identity_copies": Rewrite("drop_identity_copies", shape.drop_identity_copies),
    "cancel_inverse_permutes": Rewrite("cancel_inverse_permutes", shape.cancel_inverse_permutes),
    "expand_as_cat": Rewrite("expand_as_cat", shape.expand_as_cat),
    "split_as_slices": Rewrite("split_as_slices", shape.split_as_slices),
    "select_as_slice": Rewrite("select_as_slice", shape.select_as_slice),
    # elementwise
    "scalar_to_tensor": Rewrite("scalar_to_tensor", elementwise.scalar_to_tensor),
    "collapse_rank": Rewrite("collapse_rank", elementwise.collapse_rank),
    # reductions
    "mean_at_rank": Rewrite("mean_at_rank", reductions.mean_at_rank),
    "reduce_with_keepdim": Rewrite("reduce_with_keepdim", reductions.reduce_with_keepdim),
    "any_as_amax": Rewrite("any_as_amax", reductions.any_as_amax),
    "int_sum_in_float": Rewrite("int_sum_in_float", reductions.int_sum_in_float),
    # masks
    "cat_fill_as_pad": Rewrite("cat_fill_as_pad", masks.cat_fill_as_pad),
    "where_static_mask": Rewrite("where_static_mask", masks.where_static_mask),
    # attention at symbolic sizes (a KV-cache decoder's dynamic sequence length)
    "rotate_half_as_matmul": Rewrite("rotate_half_as_matmul", attention.rotate_half_as_matmul),
    "safe_softmax_as_floats": Rewrite("safe_softmax_as_floats", attention.safe_softmax_as_floats),
    # repeated work
    "merge_duplicates": Rewrite("merge_duplicates", duplicates.merge_duplicates),
    # scans (state-space layers)
    "short_cumsum_as_adds": Rewrite("short_cumsum_as_adds", scans.short_cumsum_as_adds),
}


def _rewrite(name: str) -> Rewrite:
    try:
        return REWRITES[name]
    except KeyError:
        raise ValueError(f"no canonicalizing rewrite {name!r}; the core has {sorted(REWRITES)}") from None


def apply_rewrite(ep: ExportedProgram, name: str, **params: Any) -> list[TransformRecord]:
    """Run the core's rewrite ``name`` on ``ep`` in place (names reserved first; graph linted and
    recompiled when it changed) and return its records, one per change.

    Unknown names and parameters raise ``ValueError`` / ``TypeError`` before ``ep`` is touched.
    """
    rewrite = _rewrite(name)
    rewrite.check(params)
    reserve_node_names(ep)
    records = rewrite.fn(ep, **params)
    if records:
        ep.graph_module.graph.lint()
        ep.graph_module.recompile()
    return records


def _run_in_pass(fn: Callable[..., list[TransformRecord]], params: dict[str, Any], ep: ExportedProgram) -> PassResult:
    # the pass runner reserves names, lints and recompiles; the records go back with the program
    return PassResult(ep, tuple(fn(ep, **params)))


def rewrite_pass(
    name: str,
    *,
    backend: str,
    stage: str = "pre_partition",
    order: int = 0,
    before: Union[str, Sequence[str]] = (),
    after: Union[str, Sequence[str]] = (),
    **params: Any,
) -> PassSpec:
    """The ``PassSpec`` that runs the core's rewrite ``name`` for ``backend`` with ``params``.

    By default it runs in the ``"pre_partition"`` stage, after the core's
    fusion: the fusion matches the norms as exported, and the rewrites shape
    what is left for the partitioner. ``stage="edge"`` runs it before the
    fusion. The pass is named ``name``; ``order``, ``before`` and ``after``
    place it among the backend's other passes of that stage. Unknown names and
    parameters raise here, when the plugin declares the pass.
    """
    if stage not in ("edge", "pre_partition"):
        raise ValueError(f"rewrite {name!r}: stage must be 'edge' or 'pre_partition' (an edge-dialect stage), got {stage!r}")
    rewrite = _rewrite(name)
    rewrite.check(params)
    return PassSpec(
        backend=backend, stage=cast(Literal["edge", "pre_partition"], stage), name=name,
        fn=functools.partial(_run_in_pass, rewrite.fn, dict(params)), order=order, before=_names(before),
        after=_names(after),
    )


def _names(given: Union[str, Sequence[str]]) -> tuple[str, ...]:
    """One pass name, or several, as the tuple ``PassSpec`` holds."""
    return (given,) if isinstance(given, str) else tuple(given)


__all__ = ["REWRITES", "Rewrite", "apply_rewrite", "rewrite_pass"]
