"""ExecuTorch's Inspector on an edgeplug xnnpack .pte names the op that diverges (issue 45).

A plugin plants a divergence after the ETRecord's aten program is taken: an edge pass computes tanh where the model
says sigmoid, and a filter keeps that node on the CPU so it has a row of its own. ``edgeplug.lower(...,
etrecord=PATH)``, the .pte run in ExecuTorch's runtime with an ETDump and a debug buffer, then
``Inspector(etdump, etrecord).calculate_numeric_gap`` (what docs/executorch-tools.md shows): the first row whose gap
is not zero is the sigmoid, the delegate before it matches. Without the pass, no row diverges.
"""

from __future__ import annotations

import pytest
import torch

import edgeplug
from edgeplug.plugin import PartitionerFilter, PassSpec, hookimpl


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.sigmoid(self.fc1(x))) * 2


def _edge(name: str):
    from executorch.exir.dialects._ops import ops as exir_ops

    return getattr(exir_ops.edge.aten, name).default


def plant_tanh(ep):
    for node in ep.graph.nodes:
        if node.target == _edge("sigmoid"):
            node.target = _edge("tanh")  # the planted divergence; the node keeps its name and debug handle


def sigmoid_or_tanh_on_cpu(node, ctx):
    from edgeplug.plugin import refuse

    if node.target in (_edge("sigmoid"), _edge("tanh")):
        return refuse("kept on the CPU so the Inspector gives it a row of its own")
    return None


class OnCpu:
    @hookimpl
    def edgeplug_partitioner_filters(self):
        yield PartitionerFilter(backend="xnnpack", name="sigmoid-on-cpu", fn=sigmoid_or_tanh_on_cpu)


class Planted:
    @hookimpl
    def edgeplug_passes(self):
        yield PassSpec(backend="xnnpack", stage="edge", name="plant-tanh", fn=plant_tanh)


def _gaps(tmp_path, x):
    from executorch.devtools import Inspector
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    torch.manual_seed(0)
    result = edgeplug.lower(MLP().eval(), (x,), "xnnpack", etrecord=tmp_path / "m.etrecord")
    result.save(tmp_path / "m.pte")
    # by path: the loader reads the file (a buffer handed to _load_for_executorch_from_buffer must outlive it)
    module = _load_for_executorch(str(tmp_path / "m.pte"), enable_etdump=True, debug_buffer_size=1 << 20)
    module.forward((x,))
    module.write_etdump_result_to_file(str(tmp_path / "run.etdp"), str(tmp_path / "run.bin"))
    inspector = Inspector(etdump_path=str(tmp_path / "run.etdp"), etrecord=str(tmp_path / "m.etrecord"),
                          debug_buffer_path=str(tmp_path / "run.bin"))
    gaps = inspector.calculate_numeric_gap("MSE")
    return [(list(ops), list(rt), float(g[0])) for ops, rt, g in zip(gaps["aot_ops"], gaps["runtime_ops"], gaps["gap"])]


@pytest.fixture
def x():
    torch.manual_seed(1)
    return torch.randn(4, 16)


def test_calculate_numeric_gap_names_the_planted_divergent_op(edgeplug_register, tmp_path, x):
    edgeplug_register(OnCpu())
    edgeplug_register(Planted())
    rows = _gaps(tmp_path, x)
    first = next(i for i, (_ops, _rt, gap) in enumerate(rows) if gap > 1e-6)
    ops, runtime_ops, gap = rows[first]
    assert ops == ["sigmoid"] and runtime_ops == ["native_call_tanh.out"] and gap > 1e-3, rows
    assert rows[:first] and all(g < 1e-10 for _o, _r, g in rows[:first]), rows  # the delegate before it matches


def test_without_the_planted_op_no_row_diverges(edgeplug_register, tmp_path, x):
    edgeplug_register(OnCpu())
    rows = _gaps(tmp_path, x)
    assert [ops for ops, _rt, _g in rows] == [["linear"], ["sigmoid"], ["linear_1", "mul"]], rows
    assert all(g < 1e-10 for _o, _r, g in rows), rows
