"""torchao's grouped int4 weight-only linear (``w4-g32``) on the Vulkan delegate.

The delegate's preprocess packs each weight two values a byte, stores its
scales transposed and no zero points (executorch's ``linear_q4gsw``). Host
verification reads every constant back from those stored bytes, so a
weight, scale or zero point the preprocess dropped or laid out differently
fails here, not on a device.
"""

from __future__ import annotations

import pytest
import torch

import edgeplug
import edgeplug._zoo


@pytest.fixture(scope="module")
def llama():
    return edgeplug._zoo.build("llama", layers=1)


@pytest.fixture(scope="module")
def lowered(llama):
    model, inputs = llama
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = edgeplug.lower(edgeplug.quantize(model, inputs, "vulkan", "w4-g32"), inputs, "vulkan", verify=True)
    return before, result


def test_a_transformers_llama_lowers_whole_and_verifies_from_the_packed_bytes(llama, lowered):
    model, _ = llama
    before, result = lowered
    report = result.report
    assert report.verification.passed and not report.cpu_ops
    note = report.verification.note
    # every linear's weight, scales and (all-zero) zero points read back as the preprocess stored them
    for what in ("8 torchao int4 weights read from their packed bytes", "8 torchao int4 scales read transposed",
                 "8 all-zero weight zero points implied (torchao int4)"):
        assert what in note, note
    q = report.quantization
    assert (q.scheme, q.kind, q.activation_bits) == ("w4-g32", "source_transform", None)
    assert 0.98 <= q.cosine_to_float[0] < 1.0 and q.versus_float[0] > q.versus_quantized[0]
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_nonzero_zero_points_are_not_implied(llama, lowered):
    """The preprocess stores no zero points (its op implies zeros): the rule that accepts their absence
    holds only for all-zero ones, so an asymmetric weight is refused instead of read as symmetric."""
    from edgeplug_vulkan_delegate.preprocess import VulkanConstants

    from executorch.exir.lowered_backend_module import get_lowered_submodules

    _, result = lowered
    (_, module, _), *_ = get_lowered_submodules(result.edge.exported_program().graph_module)

    class _NoNamedData:
        def resolve(self, tensor):
            return None

    constants = VulkanConstants(module.original_module, _NoNamedData())
    node = next(n for n in module.original_module.graph.nodes if n.op == "placeholder" and any(
        u.op == "call_function" and "dequantize_affine" in str(u.target) and len(u.args) > 3 and u.args[3] is n for u in n.users))
    zeros = torch.zeros(node.meta["val"].shape, dtype=node.meta["val"].dtype)
    assert constants.resolve(node.name, zeros) is not None
    assert constants.resolve(node.name, zeros + 1) is None
