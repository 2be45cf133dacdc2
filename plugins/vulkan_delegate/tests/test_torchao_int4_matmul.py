"""torchao's int4 linear whose input is transposed (Mamba's ``x_proj``) verifies on the host.

A linear of a non-contiguous 3-d input is exported as ``matmul``: the weight goes through
``permute``, ``expand`` to batch 1 and ``bmm``. The Vulkan preprocess matches a ``bmm`` of
batch 1 as a linear and stores its weight packed two values a byte, its scales transposed;
host verification's mirror of the preprocess knew only ``linear``/``mm``/``addmm``, so it
looked for the weight unpacked and failed with "is not in the delegate's named data"
although the delegate held it (falcon-mamba x vulkan w4-g32 in the zoo).
"""

from __future__ import annotations

import pytest
import torch

import edgeplug


class _TransposedLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(64, 20, bias=False)

    def forward(self, x):  # x: (1, 64, 8), as Mamba's hidden states before x_proj
        return self.proj(x.transpose(1, 2))


@pytest.fixture(scope="module")
def lowered():
    torch.manual_seed(0)
    model, x = _TransposedLinear().eval(), torch.randn(1, 64, 8)
    return edgeplug.lower(edgeplug.quantize(model, (x,), "vulkan", "w4-g32"), (x,), "vulkan", verify=True)


def _delegate(lowered):
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    (_, module, _), *_ = get_lowered_submodules(lowered.edge.exported_program().graph_module)
    return module.original_module


def test_the_matmul_weight_is_read_from_its_packed_bytes(lowered):
    ops = [str(n.target) for n in _delegate(lowered).graph.nodes if n.op == "call_function"]
    assert any("aten.bmm" in op for op in ops), ops  # the shape this test is about
    report = lowered.report
    assert report.verification.passed, report.verification
    note = report.verification.note
    for what in ("1 torchao int4 weights read from their packed bytes", "1 torchao int4 scales read transposed"):
        assert what in note, note


def test_a_changed_weight_fails_verification(lowered):
    """The host run computes with what the delegate stores: a weight altered after lowering is caught."""
    program = _delegate(lowered)
    name = next(s.target for s in program.graph_signature.input_specs
                if s.kind.name == "PARAMETER" and program.state_dict[s.target].dtype == torch.int8)
    program.state_dict[name].neg_()  # values no longer those packed into the named data
    try:
        with pytest.raises(Exception, match="named data"):
            edgeplug.verify(lowered, "vulkan")
    finally:
        program.state_dict[name].neg_()
