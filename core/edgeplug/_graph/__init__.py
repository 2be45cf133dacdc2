"""Graph transforms every backend shares.

- ``reserve_node_names``: keep names a pass creates unused (pytorch#202927).
- ``run_passes``: the pass runner every backend pass goes through; a pass
  returns its program and its records (``PassResult``), and the runner
  returns the last program with every record (the report's ``transforms``).
- ``resolve_scalar``: the compile-time value of a scalar operand.
- ``constant_only_nodes`` / ``weight_source`` / ``fold_constant(s)``: what is
  known at AOT, where a weight comes from, and turning a computed constant
  into a real constant of the program.
- ``edgeplug._graph.fold``: the core's constant folding
  (``fold_constant_subgraphs(ep, budget=...)``), the first edge-stage pass.
- ``edgeplug._graph.decompose``: what ``to_edge`` cannot take (``aten.histc``,
  ...), rewritten into core ATen ops on the aten program before it, by the core
  (``export_decompositions``); ``edgeplug._graph.histc``: the exact ``histc``.
- ``edgeplug._graph.canonical``: exact rewrites a backend chooses from
  (``rewrite_pass(name, backend=..., **params)`` in its passes hook), one
  module per family and one table by name (``canonical.table``).
"""

from edgeplug._graph.constants import (
    ConstantAnalysis,
    WeightSource,
    analyze_constants,
    constant_only_nodes,
    fold_constant,
    fold_constants,
    weight_source,
)
from edgeplug._graph.names import NameReservationError, reserve_node_names
from edgeplug._graph.passes import PassResult, run_passes
from edgeplug._graph.scalars import resolve_scalar

__all__ = [
    "ConstantAnalysis",
    "NameReservationError",
    "PassResult",
    "WeightSource",
    "analyze_constants",
    "constant_only_nodes",
    "fold_constant",
    "fold_constants",
    "reserve_node_names",
    "resolve_scalar",
    "run_passes",
    "weight_source",
]
