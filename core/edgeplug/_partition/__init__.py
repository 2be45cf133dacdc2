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

from edgeplug._graph.ops import op_name
from edgeplug._partition.adapter import CorePartitioner
from edgeplug._partition.phases import KeepWholeDecisions, PartitionOutcome, PartitionRecord, StrandedNode
from edgeplug._partition.support import SupportCheck, support_check
from edgeplug._partition.table import SupportTablePartitioner
from edgeplug._partition.verdict import TAKEN, FilterContext, Verdict, refuse

__all__ = [
    "CorePartitioner",
    "FilterContext",
    "KeepWholeDecisions",
    "PartitionOutcome",
    "PartitionRecord",
    "StrandedNode",
    "SupportCheck",
    "SupportTablePartitioner",
    "TAKEN",
    "Verdict",
    "op_name",
    "refuse",
    "support_check",
]
