"""The core's attention rewrites (rotate_half_as_matmul, safe_softmax_as_floats) leave only ops XNNPACK's
partitioner configs take where the guards were: checked with executorch's own configs on a real
exported program (the rewrites' exactness and negatives are the core's tests).
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

from edgeplug._graph.ops import op_name
from edgeplug.plugin import apply_rewrite
from edgeplug.testing.rewrites import RotaryAttention, attention_inputs, attention_program


@pytest.fixture(scope="module")
def attention_edge():
    torch.manual_seed(0)
    model = RotaryAttention().eval()
    return model, attention_program(model, attention_inputs(5))


def _xnnpack_refuses(ep) -> list[str]:
    """The ops of ``ep`` executorch's XNNPACK partitioner configs refuse (or have no config for)."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS

    configs = {c.target_name: c for c in (cls() for cls in ALL_PARTITIONER_CONFIGS) if hasattr(c, "target_name")}
    refused = []
    for n in ep.graph_module.graph.nodes:
        if n.op == "call_function" and "sym_size" not in op_name(n):
            config = configs.get(op_name(n).removeprefix("aten."))
            if config is None or not config.check_constraints(n, ep):
                refused.append(op_name(n))
    return refused


def test_both_leave_only_ops_xnnpack_takes_where_the_guards_were(attention_edge):
    _, ep = attention_edge
    refused_before = Counter(_xnnpack_refuses(ep))
    after = copy.deepcopy(ep)
    for name in ("rotate_half_as_matmul", "safe_softmax_as_floats", "scalar_to_tensor"):
        apply_rewrite(after, name)
    refused_after = Counter(_xnnpack_refuses(after))
    for op in ("aten.eq.Scalar", "aten.logical_not.default", "aten.any.dim", "aten.full_like.default", "aten.neg.default"):
        assert refused_after[op] == 0, (op, refused_after)
    # the dynamic rotate_half's two slices are gone; the static one (the keys') and the mask's ops stay
    assert refused_before["aten.slice_copy.Tensor"] - refused_after["aten.slice_copy.Tensor"] == 2
    assert sum(refused_after.values()) < sum(refused_before.values()) - 6
