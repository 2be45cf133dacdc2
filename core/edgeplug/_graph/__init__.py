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

from __future__ import annotations

from typing import Optional

from edgeplug._lazy import lazy_names

# name -> (module, attribute): imported on first use, so importing one light submodule (ops, which the registry reads)
# does not load the heavy ones (executorch) through this package
_LAZY: dict[str, tuple[str, Optional[str]]] = {
    "ConstantAnalysis": ("edgeplug._graph.constants", "ConstantAnalysis"),
    "WeightSource": ("edgeplug._graph.constants", "WeightSource"),
    "analyze_constants": ("edgeplug._graph.constants", "analyze_constants"),
    "constant_only_nodes": ("edgeplug._graph.constants", "constant_only_nodes"),
    "fold_constant": ("edgeplug._graph.constants", "fold_constant"),
    "fold_constants": ("edgeplug._graph.constants", "fold_constants"),
    "weight_source": ("edgeplug._graph.constants", "weight_source"),
    "NameReservationError": ("edgeplug._graph.names", "NameReservationError"),
    "reserve_node_names": ("edgeplug._graph.names", "reserve_node_names"),
    "PassResult": ("edgeplug._graph.passes", "PassResult"),
    "run_passes": ("edgeplug._graph.passes", "run_passes"),
    "resolve_scalar": ("edgeplug._graph.scalars", "resolve_scalar"),
}

__getattr__, __dir__ = lazy_names(__name__, _LAZY)

__all__ = sorted(_LAZY)
