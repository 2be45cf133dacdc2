"""ExecuTorch's own example models lower and verify on every backend, fp32 and bf16 (issue 15).

The models are executorch's (``executorch.examples.models``): the Llama
transformer built from a tiny ``ModelArgs`` (no checkpoint, no params file,
nothing downloaded) with and without its KV cache, the same transformer
configured as Qwen3 (q/k norms before RoPE), LFM2's hybrid of short
convolutions and attention, and MobileNet v2/v3 when torchvision imports.

torchvision does not import beside torch 2.13.0 (CPU) from PyPI: the only
release pinned to torch 2.13.0, torchvision 0.28.0, is a CUDA build whose
``torchvision/_C.so`` needs ``libc10_cuda.so``, so ``import torchvision`` ends
in "operator torchvision::nms does not exist"; 0.29.x requires torch>=2.14
(pip would replace torch with a CUDA build). So MobileNet is also tested
through its building blocks, written after torchvision's definitions
(``mobilenet_v2-blocks``, ``mobilenet_v3-blocks``: ``edgeplug.testing.programs.mobilenet_blocks``): conv + batch norm +
relu6 (hardtanh), the inverted residual with its depthwise convolution, and
V3's hardswish and squeeze-excitation (hardsigmoid gate), tiny and random,
with batch-norm statistics far from the identity so a fold that is skipped
or wrong shows in the numbers.

Each is lowered as a user would, ``edgeplug.lower(model, inputs, backend,
verify=True)`` on every installed backend and every fixture backend (a dry run where the backend's SDK
is absent, no verification where its programs cannot run here), and compared with stock executorch (``to_edge_transform_and_lower`` with the
backend's own partitioner, through edgeplug._zoo's ``lower_stock``): no more
partitions or CPU nodes than stock, every norm fused or recorded with its
reason, and the numbers within the report's tolerance of eager.

A few cases on the fixture backends run by default; the slow ones are marked; the whole set (every
installed backend) runs with ``EDGEPLUG_ZOO=1`` (``make zoo``); each backend's own cases are its plugin's tests. Cases that fail because of an open defect of
issue 15 are ``xfail(strict=True)``: they turn into failures once it is fixed,
and the marker comes off.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

import edgeplug
from edgeplug._models import MODELS
from edgeplug.testing.programs import mobilenet_blocks

WHOLE_SET = os.environ.get("EDGEPLUG_ZOO") == "1"

#: example (the cases' names) -> the model of edgeplug._models it is (None: built here, not registered)
EXAMPLES = {
    "llama": "executorch-llama",
    "llama-kv": "executorch-llama-kv",
    "qwen3": "executorch-llama-as-qwen3",
    "lfm2": "executorch-llama-as-lfm2",
    "mobilenet_v2": None,
    "mobilenet_v3": None,
    "mobilenet_v2-blocks": "testing-mobilenet-v2-blocks",
    "mobilenet_v3-blocks": "testing-mobilenet-v3-blocks",
}
#: batch norms in each MobileNet-blocks model (a backend's preprocess may fold each into its convolution)
BLOCK_BATCH_NORMS = {"mobilenet_v2-blocks": 10, "mobilenet_v3-blocks": 10}
BATCH_NORM = "aten._native_batch_norm_legit_no_training.default"

#: cases that run without EDGEPLUG_ZOO=1: (example, dtype, backend) -> "default" or "slow"
#: (a dry run where the SDK is absent, and a verified lowering of the MobileNet blocks; what issue 15
#: fixed per backend, batch norms folded by a preprocess, dict inputs to the runtime, bf16, is tested
#: with the plugins concerned)
SELECTED = {
    ("llama", "fp32", "fixture-offline"): "default",
    ("mobilenet_v3-blocks", "fp32", "fixture-fused"): "slow",
}
#: open defects of issue 15, (example, dtype, backend) -> item; the test fails once they are fixed
#: (example, dtype, backend) -> the open defect that makes it fail; xfail(strict) so a fix shows.
#: Empty: issue 15 item 1 (bf16 where only the fp32 upcast is refused) is fixed: fusion asks the backend's
#: support check and keeps the upcast outside the fused op.
KNOWN: dict[tuple[str, str, str], str] = {}


def _backends() -> list[str]:
    """The installed backends, then the fixture backends."""
    import edgeplug_fixture_backends

    return [*edgeplug.backends(), *edgeplug_fixture_backends.ALL]


def _cases():
    for example in EXAMPLES:
        for dtype in ("fp32", "bf16"):
            for backend in _backends():
                key = (example, dtype, backend)
                marks = []
                kind = SELECTED.get(key)
                if kind != "default":
                    marks.append(pytest.mark.slow)
                if kind is None and not WHOLE_SET:
                    marks.append(pytest.mark.skip(reason="the whole set runs in `make zoo` (EDGEPLUG_ZOO=1)"))
                if key in KNOWN:
                    marks.append(pytest.mark.xfail(strict=True, reason=KNOWN[key]))
                yield pytest.param(example, dtype, backend, marks=marks, id=f"{example}-{dtype}-{backend}")


def _torchvision():
    """torchvision, or a skip that says why it does not import here."""
    try:
        import torchvision
    except Exception as exc:  # a CUDA build beside CPU torch raises RuntimeError, not ImportError
        pytest.skip(
            f"torchvision does not import here ({type(exc).__name__}: {exc}); executorch's MobileNet "
            "examples are torchvision models: the mobilenet_*-blocks cases test their building blocks"
        )
    return torchvision


def _mobilenet(version: str):
    tv = _torchvision()
    # executorch's MV2Model/MV3Model load pretrained weights (a download): the same
    # torchvision architectures, randomly initialised, are what is lowered instead
    torch.manual_seed(0)
    if version == "mobilenet_v2":
        model = tv.models.mobilenet_v2(weights=None, width_mult=0.25)
    else:
        model = tv.models.mobilenet_v3_small(weights=None)
    return model.eval(), (torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1)),)


def build_example(example: str, dtype: torch.dtype):
    """executorch's example ``example``, tiny and random: (model, example inputs)."""
    registered = EXAMPLES[example]
    if registered is None:
        model, inputs = _mobilenet(example)
    else:
        model, inputs = MODELS[registered].build()
    if registered is None or registered.startswith("testing-mobilenet"):
        return model.to(dtype), tuple(t.to(dtype) for t in inputs)
    return model.to(dtype), inputs  # token ids (and the KV cache's input_pos) stay integers


@pytest.fixture(scope="session")
def examples(zoo):
    """(example, dtype) -> (model, inputs, aten program, norms present), built once per session."""
    cache: dict = {}

    def get(example: str, dtype: str):
        if (example, dtype) not in cache:
            model, inputs = build_example(example, {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype])
            with torch.no_grad():  # stock executorch needs it for the KV cache (issue 15 item 4)
                ep = torch.export.export(copy.deepcopy(model), inputs)
            cache[(example, dtype)] = (model, inputs, ep, zoo.count_norms(ep))
        return cache[(example, dtype)]

    return get


def _stock(zoo, ep, backend: str):
    target = zoo.target(backend)
    with torch.no_grad():
        return zoo.lower_stock(ep, (), [], target)


@pytest.mark.parametrize("example,dtype,backend", list(_cases()))
def test_example_lowers_like_stock_or_better(zoo, examples, fixture_backends, example, dtype, backend):
    if backend not in edgeplug.backends():
        pytest.skip(f"backend {backend!r} is not installed")
    b = edgeplug.get_backend(backend)
    if not b.availability().dry_run:  # refused before any work on this release: tests/test_executorch_versions.py
        pytest.skip(f"backend {backend!r} cannot partition here: {b.availability().reason}")
    model, inputs, ep, norms = examples(example, dtype)
    dry = not b.availability().ok
    verify = not dry and b.spec.verify_method != "none"
    state = copy.deepcopy(model.state_dict())

    result = edgeplug.lower(model, inputs, backend, verify=verify, dry_run=dry, model_name=f"{example}-{dtype}")
    report = result.report
    table = report.to_table()

    # the caller's model is left as it was (lower works on a copy)
    for name, value in model.state_dict().items():
        assert torch.equal(value, state[name]), f"lower changed the caller's {name}"

    # every norm is fused or has a record with its reason
    if edgeplug.get_backend(backend).fusion_policy("rms_norm") is not None:
        assert len(report.fusions) == norms, table
        assert all(f.reason for f in report.fusions if str(f.outcome) == "rejected"), table
    assert not report.kept_whole_on_cpu, table

    if dry:
        assert report.dry_run, table
        refused_bf16 = [c for c in report.cpu_nodes if "does not support dtype torch.bfloat16" in c.reason]
        # a backend whose op builders have no bf16 tensor type (only fp16 and fp32): a model that is
        # bf16 throughout delegates nothing, and each node says which op and which dtype was refused
        assert report.partitions or (dtype == "bf16" and refused_bf16 == report.cpu_nodes), table
        return
    if not verify:
        return

    # numbers against eager, within the report's tolerance for the dtype (fp32: 1e-4)
    v = report.verification
    assert v is not None and v.outputs, table
    assert v.passed, "\n".join(v.failures()) + "\n" + table
    if dtype == "fp32":
        assert v.max_abs_diff <= 1e-4, table
    # how a backend's host verification reads batch norms its preprocess folds is its plugin's test

    # against stock executorch, from the same exported program
    stock = _stock(zoo, ep, backend)
    if not stock.ok:
        return  # edgeplug lowered and verified what stock executorch cannot lower: nothing to compare
    assert len(report.partitions) <= stock.partitions, (stock.partitions, table)
    assert report.cpu_node_count <= stock.cpu_nodes, (stock.cpu_ops, table)


def test_mobilenet_needs_torchvision_or_skips_with_reason():
    """The skip says why torchvision is unusable; with it working the model builds without a download."""
    try:
        import torchvision  # noqa: F401
    except Exception as exc:
        with pytest.raises(pytest.skip.Exception, match=f"torchvision does not import here \\({type(exc).__name__}"):
            build_example("mobilenet_v2", torch.float32)
        return
    model, inputs = build_example("mobilenet_v2", torch.float32)
    assert model(*inputs).shape[0] == 1


@pytest.mark.parametrize("example", sorted(BLOCK_BATCH_NORMS))
def test_mobilenet_blocks_hold_what_mobilenet_is_made_of(example):
    """The stand-ins export to MobileNet's ops: depthwise convolution, batch norm, relu6, and V3's gates."""
    model, inputs = build_example(example, torch.float32)
    ep = torch.export.export(model, inputs).run_decompositions({})
    ops = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert ops.count(BATCH_NORM) == BLOCK_BATCH_NORMS[example], ops
    # conv2d(input, weight, bias, stride, padding, dilation, groups): depthwise has a group per channel
    convs = [n for n in ep.graph.nodes if n.target is torch.ops.aten.conv2d.default]
    depthwise = [n for n in convs if len(n.args) > 6 and n.args[6] == n.args[0].meta["val"].shape[1] > 1]
    assert depthwise, "no depthwise convolution (one group per input channel)"
    assert any(list(n.args[3]) == [2, 2] for n in depthwise), "no strided depthwise convolution"
    assert "aten.add.Tensor" in ops, "no residual connection"
    if example == "mobilenet_v2-blocks":
        assert "aten.hardtanh.default" in ops, "relu6 is hardtanh(0, 6) in the graph"
    else:
        assert {"aten.hardswish.default", "aten.hardsigmoid.default", "aten.adaptive_avg_pool2d.default"} <= set(ops), set(ops)


def test_kv_cache_example_holds_a_dict_and_state():
    """What makes the KV-cache case different: dict inputs and buffers updated in place."""
    model, inputs = build_example("llama-kv", torch.float32)
    assert isinstance(inputs[1], dict) and set(inputs[1]) == {"input_pos"}
    caches = [n for n, _ in model.named_buffers() if "cache" in n]
    assert caches, "the KV-cache transformer has no cache buffers"
    with torch.no_grad():
        ep = torch.export.export(copy.deepcopy(model), inputs)
    # torch.export keeps the in-place cache update; functionalised, it is a buffer mutation
    mutated = set(ep.run_decompositions({}).graph_signature.buffers_to_mutate.values())
    assert {c for c in caches if c.endswith("k_cache")} <= mutated, mutated


def test_mobilenet_blocks_refuse_a_version_they_do_not_build():
    with pytest.raises(ValueError, match=r"version must be 'v2' or 'v3', not 'mobilenet_v2-blocks'"):
        mobilenet_blocks("mobilenet_v2-blocks")
