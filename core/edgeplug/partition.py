"""The core partitioner: one support predicate for "keep whole" and "delegate".

``CorePartitioner`` wraps a backend's executorch partitioner. It answers
``ops_to_not_decompose`` from the backend's skip tables and partitioner
filters, and records what the wrapped partitioner tagged, so the report can
name every partition and every node left on the CPU.

``SupportTablePartitioner`` is for backends whose own partitioner needs a
vendor SDK just to be constructed (QNN, Samsung): it partitions from a table
of supported edge ops the plugin declares.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

import torch
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data
from torch.export import ExportedProgram
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from edgeplug.backend import Backend


def op_name(target: Any) -> str:
    """A short, stable name for an op target: 'aten.linear.default'."""
    t = aten_overload(target)
    schema = getattr(t, "_schema", None)
    if schema is not None and hasattr(t, "_overloadname"):
        return f"{schema.name.replace('::', '.')}.{t._overloadname}"
    return getattr(t, "__name__", None) or str(t)


def aten_overload(target: Any) -> Any:
    """The aten OpOverload behind an edge op (or the target itself)."""
    if isinstance(target, torch._ops.OpOverload):
        return target
    return getattr(target, "_op", target)


@dataclass
class FilterContext:
    """What a partitioner filter sees besides the node."""

    stage: str
    ep: Optional[ExportedProgram] = None
    constant_only: frozenset = frozenset()


@dataclass
class PartitionRecord:
    tag: str
    backend_id: str
    nodes: list[str] = field(default_factory=list)
    ops: Counter = field(default_factory=Counter)


class CorePartitioner(Partitioner):
    """Wraps ``backend``'s partitioner; in ``dry_run`` mode it delegates nothing."""

    def __init__(self, backend: Backend, *, dry_run: bool = False) -> None:
        import logging

        self.backend = backend
        root = logging.getLogger()
        level = root.level
        self.inner = backend.make_partitioner()
        root.setLevel(level)  # some executorch partitioners set the root logger to INFO on import
        self.dry_run = dry_run
        self.stage = "before_decomposition"
        self.partitions: list[PartitionRecord] = []
        self.cpu_reasons: dict[str, str] = {}
        super().__init__()

    # keep-whole ---------------------------------------------------------------
    def _filter(self, node: torch.fx.Node, inner_check: Optional[Callable[[Any], bool]], ctx: FilterContext) -> bool:
        verdict: Optional[bool] = None
        for f in self.backend.filters:
            r = f.fn(node, ctx)
            if r is not None:
                verdict = bool(r) if verdict is None else (verdict and bool(r))
        if verdict is not None:
            return verdict
        return True if inner_check is None else bool(inner_check(node))

    def ops_to_not_decompose(self, ep: ExportedProgram):
        inner_ops: list[Any] = []
        inner_check = None
        if hasattr(self.inner, "ops_to_not_decompose"):
            inner_ops, inner_check = self.inner.ops_to_not_decompose(ep)
        ops = list(dict.fromkeys(list(self.backend.skip_ops) + list(inner_ops or [])))
        if self.dry_run and self.stage == "after_lowering":
            return [], None
        ctx = FilterContext(stage=self.stage, ep=ep)
        return ops, lambda node: self._filter(node, inner_check, ctx)

    # partition ----------------------------------------------------------------
    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        self.stage = "partition"
        result = self.inner.partition(exported_program)
        by_tag: dict[str, PartitionRecord] = {}
        for node in result.tagged_exported_program.graph_module.graph.nodes:
            tag = node.meta.get("delegation_tag")
            if node.op != "call_function" or tag is None:
                continue
            spec = result.partition_tags.get(tag)
            rec = by_tag.setdefault(tag, PartitionRecord(tag, getattr(spec, "backend_id", "?")))
            rec.nodes.append(node.name)
            rec.ops[op_name(node.target)] += 1
        self.partitions = list(by_tag.values())
        self.stage = "after_lowering"
        if self.dry_run:
            for node in result.tagged_exported_program.graph_module.graph.nodes:
                node.meta.pop("delegation_tag", None)
            return PartitionResult(result.tagged_exported_program, {})
        return result


class _TableSupport(OperatorSupportBase):
    def __init__(self, supported: set[Any], dtypes: set[torch.dtype]) -> None:
        self.supported = supported
        self.dtypes = dtypes

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if node.target not in self.supported and aten_overload(node.target) not in self.supported:
            return False
        val = node.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else [val]
        for v in vals:
            if isinstance(v, torch.Tensor) and v.dtype not in self.dtypes:
                return False
        return True


class SupportTablePartitioner(Partitioner):
    """Delegates every node whose (aten) op is in ``supported`` and dtype allowed."""

    def __init__(
        self,
        backend_id: str,
        supported: Iterable[Any],
        *,
        keep_whole: Iterable[Any] = (),
        dtypes: Iterable[torch.dtype] = (torch.float32, torch.float16, torch.int64, torch.int32, torch.bool),
        compile_specs: Optional[list[Any]] = None,
    ) -> None:
        super().__init__()
        self.backend_id = backend_id
        self.supported = {aten_overload(op) for op in supported}
        self.keep_whole = list(keep_whole)
        self.support = _TableSupport(self.supported, set(dtypes))
        self.delegation_spec = DelegationSpec(backend_id, list(compile_specs or []))

    def ops_to_not_decompose(self, ep: ExportedProgram):
        return [op for op in self.keep_whole if op in self.supported], None

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        gm = exported_program.graph_module
        partitions = CapabilityBasedPartitioner(
            gm, self.support, allows_single_node_partition=True
        ).propose_partitions()
        tags: dict[str, DelegationSpec] = {}
        for p in partitions:
            tag = f"{self.backend_id}_{p.id}"
            for node in p.nodes:
                node.meta["delegation_tag"] = tag
            tags[tag] = self.delegation_spec
        tag_constant_data(exported_program)
        return PartitionResult(exported_program, tags)
