"""The SDK-free QNN and Samsung tables partition like the real partitioners.

Without the vendor SDK, qnn and samsung dry-run from the support tables their
plugins declare. The tables take what executorch's QNN and Samsung op builders
take for these programs: per-tensor and per-channel quantize/dequantize and
the integer dtypes of quantized programs, batch norm, hardtanh and clamp; and
the layout-only copies the real flows remove before partitioning
(``_clone_dim_order``, ``alias_copy``) are removed here too.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edgeplug

BACKENDS = ["qnn", "samsung"]
QDQ = ("quantize_per", "dequantize_per")


class ConvBnRelu6(nn.Module):
    """MobileNet's block: conv, batch norm, relu6 (hardtanh), and a clamp."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return torch.clamp(F.relu6(self.bn(self.conv(x))), -1.0, 5.0)


class Copies(nn.Module):
    """Layout-only copies to_edge keeps: clone and alias."""

    def forward(self, x):
        y = torch.ops.aten.alias.default(x * 2.0)
        return (y.clone() + 1.0).clone() * 3.0


def _layout(rep):
    delegated = {op for p in rep.partitions for op in p.ops}
    return delegated, [c.op for c in rep.cpu_nodes]


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_norm_hardtanh_and_clamp_are_delegated(backend):
    rep = edgeplug.lower(ConvBnRelu6().eval(), (torch.randn(1, 3, 8, 8),), backend, dry_run=True).report
    delegated, cpu = _layout(rep)
    assert cpu == [], rep.to_table()
    assert len(rep.partitions) == 1
    assert {"aten._native_batch_norm_legit_no_training.default", "aten.hardtanh.default", "aten.clamp.default"} <= delegated


@pytest.mark.parametrize("backend", BACKENDS)
def test_identity_copies_are_removed_as_the_real_flow_removes_them(backend):
    result = edgeplug.lower(Copies(), (torch.randn(2, 4),), backend, dry_run=True)
    delegated, cpu = _layout(result.report)
    assert cpu == [] and len(result.report.partitions) == 1, result.report.to_table()
    ops = {str(n.target) for n in result.edge.exported_program().graph.nodes if n.op == "call_function"}
    assert not any("clone" in o or "alias" in o for o in ops), ops


def test_a_copy_that_is_a_program_output_stays():
    """Removing it could make an output alias an input: it is kept (and reported on the CPU)."""
    from executorch.exir import EdgeCompileConfig, to_edge

    from edgeplug._graph.canonical.shape import drop_identity_copies
    from edgeplug._graph.copies import is_identity_copy

    class OutClone(nn.Module):
        def forward(self, x):
            return x.clone(), (x * 2.0).clone() + 1.0

    ep = to_edge(torch.export.export(OutClone(), (torch.randn(2, 4),)), compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    copies = [n for n in ep.graph.nodes if n.op == "call_function" and is_identity_copy(n)]
    assert len(copies) == 2
    records = drop_identity_copies(ep)
    left = [n for n in ep.graph.nodes if n.op == "call_function" and is_identity_copy(n)]
    assert len(left) == 1 and any(u.op == "output" for u in left[0].users)
    assert [(r.transform, r.kind, r.removed, r.added) for r in records] == [("drop_identity_copies", "rewrite", 1, 0)]
    assert records[0].node not in {n.name for n in ep.graph.nodes}
    x = torch.randn(2, 4)
    assert all(torch.equal(a, b) for a, b in zip(ep.module()(x), OutClone()(x)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_tables_take_quantize_dequantize_and_integer_dtypes(backend):
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    table = edgeplug.get_backend(backend).make_partitioner()
    q = torch.ops.quantized_decomposed
    for op in (q.quantize_per_tensor.default, q.dequantize_per_tensor.default, q.quantize_per_channel.default, q.dequantize_per_channel.default):
        assert op in table.supported, op
    assert {torch.int8, torch.uint8} <= table.dtypes
    assert torch.float64 not in table.dtypes


def _quantized_llama(backend, scheme):
    from edgeplug.examples.llama import tiny_llama

    model, inputs = tiny_llama(layers=2)
    float_rep = edgeplug.lower(model, inputs, backend, dry_run=True).report
    q = edgeplug.quantize(model, inputs, backend, scheme)
    return float_rep, edgeplug.lower(q, inputs, backend, dry_run=True).report


@pytest.mark.slow
@pytest.mark.parametrize("backend, scheme", [("qnn", "8a8w"), pytest.param("samsung", "a8w8")])
def test_a_quantized_llama_partitions_like_the_float_one(backend, scheme):
    """Issue 10: 55 partitions for qnn 8a8w (3 in float), every q/dq on the CPU."""
    float_rep, q_rep = _quantized_llama(backend, scheme)
    assert len(q_rep.partitions) <= len(float_rep.partitions), q_rep.to_table()
    assert not [c for c in q_rep.cpu_nodes if any(k in c.op for k in QDQ)], q_rep.to_table()
    delegated = {op for p in q_rep.partitions for op in p.ops}
    assert any("dequantize_per_channel" in op for op in delegated) and any("quantize_per_tensor" in op for op in delegated)
    assert q_rep.kept_whole_on_cpu == []
