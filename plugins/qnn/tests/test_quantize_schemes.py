"""QNN's 16a4w scheme (16-bit activations, 4-bit weights) through the strict dry run.

The dry run is a real lowering with a stand-in preprocess: a program the HTP
flow would refuse fails here at the same stage. Without the SDK, QnnQuantizer
annotates without the SDK's op-constraint tables (``sdk_left_to_caller``).
"""

from __future__ import annotations

import torch

import edgeplug
from edgeplug.plugin import QuantScheme


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 16)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def test_16a4w_quantizes_with_16_bit_activations_and_4_bit_weights_and_dry_runs():
    torch.manual_seed(0)
    model, x = _Block().eval(), torch.randn(4, 32)
    scheme = {s.scheme: s for s in edgeplug.get_backend("qnn").records(QuantScheme)}["16a4w"]
    assert (scheme.activation_bits, scheme.weight_bits, scheme.kind) == (16, 4, "pt2e")
    quantized = edgeplug.quantize(model, (x,), "qnn", "16a4w")
    # the converted program holds what the scheme says: 16-bit activation ranges, 4-bit weight ranges
    ranges = set()
    for n in quantized.program.graph.nodes:
        if n.op == "call_function" and "quantize_per" in str(n.target):  # quantize and dequantize nodes
            qmin, qmax = n.args[-3], n.args[-2]
            ranges.add((qmin, qmax))
    assert (0, 65535) in ranges or (-32768, 32767) in ranges, ranges
    assert ranges & {(-8, 7), (-7, 7)}, ranges  # 4-bit weights (symmetric: -7..7)
    result = edgeplug.lower(quantized, (x,), "qnn", dry_run=True)
    assert result.report.partitions and not any("linear" in op for op in result.report.cpu_ops)
    assert result.report.quantization.scheme == "16a4w"
