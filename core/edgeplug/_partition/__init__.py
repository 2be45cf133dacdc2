"""The core partitioner: one predicate decides "keep whole" and "delegate".

Each executorch backend answers two questions separately: which ops to keep
whole before decomposition (``ops_to_not_decompose``) and which nodes to
delegate (``partition``). When the answers disagree a kept-whole op is left
whole on the CPU, and lowering fails late with "... was not decomposed or
delegated". ``CorePartitioner`` asks one predicate, ``delegable(node, ctx)``,
everywhere:

- before decomposition: an op of the backend's keep-whole records is kept
  whole only where ``delegable`` says the backend will take that node;
  otherwise it is decomposed into ops the backend (or the CPU) runs.
- partition: the backend's executorch partitioner says which nodes it
  supports (what it tags, and the reasons it logs for the rest); the filters
  and the constant-only rule may refuse some; the core then forms the
  partitions itself from the accepted nodes (torch's capability-based
  partitioning), so a refusal never leaves a dependency cycle, whatever the
  partitioner. Every node left on the CPU gets a reason.
- the stranded check: a kept-whole op, or an op a fusion created for the
  backend, left on the CPU is reported with op, node and why
  (``StrandedNode``); a real lowering fails there, before serialization.
  Filters cannot silence this check.

``delegable`` is: the backend's support check (``support_check``: from
``BackendSpec.support_check``, or a table partitioner's ``verdict``), then
the partitioner filters plugins register (``False``, or a falsy ``Verdict``
carrying the filter's reason, refuses a node), then, for backends with
``BackendSpec.constant_only_policy``, the constant-only rule: a node that
reads no runtime input is not delegated, unless a filter accepts it
explicitly (quantize/dequantize of a weight). Constant-only-ness comes from
``edgeplug._graph.constant_only_nodes``.

The phases are functions in ``edgeplug._partition.phases``; ``CorePartitioner``
(``adapter``, one per lowering) runs them behind executorch's ``Partitioner``
interface and keeps what they decided as frozen records, each set once
(``KeepWholeDecisions``, ``PartitionOutcome``). It configures no logging. ``SupportTablePartitioner``
(``table``) partitions from a table of supported edge ops a plugin declares,
for backends whose own partitioner needs a vendor SDK to be constructed.
"""

from __future__ import annotations

from typing import Optional

from edgeplug._lazy import lazy_names

# name -> (module, attribute): imported on first use, so importing one light submodule (the verdicts filters answer with)
# does not load the heavy ones (executorch) through this package
_LAZY: dict[str, tuple[str, Optional[str]]] = {
    "op_name": ("edgeplug._graph.ops", "op_name"),
    "CorePartitioner": ("edgeplug._partition.adapter", "CorePartitioner"),
    "KeepWholeDecisions": ("edgeplug._partition.phases", "KeepWholeDecisions"),
    "PartitionOutcome": ("edgeplug._partition.phases", "PartitionOutcome"),
    "PartitionRecord": ("edgeplug._partition.phases", "PartitionRecord"),
    "StrandedNode": ("edgeplug._partition.phases", "StrandedNode"),
    "SupportCheck": ("edgeplug._partition.support", "SupportCheck"),
    "support_check": ("edgeplug._partition.support", "support_check"),
    "SupportTablePartitioner": ("edgeplug._partition.table", "SupportTablePartitioner"),
    "TAKEN": ("edgeplug._partition.verdict", "TAKEN"),
    "FilterContext": ("edgeplug._partition.verdict", "FilterContext"),
    "Verdict": ("edgeplug._partition.verdict", "Verdict"),
    "refuse": ("edgeplug._partition.verdict", "refuse"),
}

__getattr__, __dir__ = lazy_names(__name__, _LAZY)

__all__ = sorted(_LAZY)
