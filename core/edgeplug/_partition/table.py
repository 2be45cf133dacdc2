"""``SupportTablePartitioner``: SDK-free partitioning from a table a plugin declares.

For backends whose own partitioner needs a vendor SDK just to be constructed:
it delegates every node whose op is in the table and whose dtypes the backend
takes, and gives a reason for each refusal (its ``verdict`` is the backend's
support check, see ``edgeplug._partition.support_check``).
"""

from __future__ import annotations

import operator
from typing import Any, Iterable, Optional

import torch
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data
from torch.export import ExportedProgram
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from edgeplug._graph.ops import aten_overload, op_name
from edgeplug._partition.support import SupportCheck
from edgeplug._partition.verdict import TAKEN, Verdict

DEFAULT_DTYPES = (torch.float32, torch.float16, torch.int64, torch.int32, torch.bool)


class _TableSupport(OperatorSupportBase):
    def __init__(self, verdict: SupportCheck) -> None:
        self.verdict = verdict

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        if node.op == "call_function" and node.target is operator.getitem:
            # unpacks a tuple (batch norm's): goes with its op, or it splits the partition there
            return isinstance(node.args[0], torch.fx.Node) and self.verdict(node.args[0]).ok
        return self.verdict(node).ok


class SupportTablePartitioner(Partitioner):
    """Delegates every node whose (aten) op is in ``supported`` and whose dtypes are allowed.

    ``dtypes``: the tensor dtypes the backend takes (of a node's outputs).
    """

    def __init__(
        self,
        backend_id: str,
        supported: Iterable[Any],
        *,
        keep_whole: Iterable[Any] = (),
        dtypes: Iterable[torch.dtype] = DEFAULT_DTYPES,
        compile_specs: Optional[list[Any]] = None,
        name: str = "",
    ) -> None:
        super().__init__()
        self.backend_id = backend_id
        self.name = name or backend_id
        self.supported = {aten_overload(op) for op in supported}
        self.keep_whole = list(keep_whole)
        self.dtypes = set(dtypes)
        self.delegation_spec = DelegationSpec(backend_id, list(compile_specs or []))

    def verdict(self, node: torch.fx.Node) -> Verdict:
        if node.op != "call_function":
            return Verdict(False, "not an op")
        if aten_overload(node.target) not in self.supported:
            return Verdict(False, f"{op_name(node.target)} is not in the {self.name} support table")
        val = node.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else [val]
        for v in vals:
            if isinstance(v, torch.Tensor) and v.dtype not in self.dtypes:
                return Verdict(False, f"{self.name} does not support dtype {v.dtype} (output of {op_name(node.target)})")
        return TAKEN

    def ops_to_not_decompose(self, ep: Optional[ExportedProgram]):
        return [op for op in self.keep_whole if op in self.supported], lambda node: self.verdict(node).ok

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        gm = exported_program.graph_module
        partitions = CapabilityBasedPartitioner(
            gm, _TableSupport(self.verdict), allows_single_node_partition=True
        ).propose_partitions()
        tags: dict[str, DelegationSpec] = {}
        for p in partitions:
            tag = f"{self.backend_id}_{p.id}"
            for node in p.nodes:
                node.meta["delegation_tag"] = tag
            tags[tag] = self.delegation_spec
        tag_constant_data(exported_program)
        return PartitionResult(exported_program, tags)
