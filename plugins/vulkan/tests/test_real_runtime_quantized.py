"""optimum-executorch's quantized KV-cache program (linear 8da4w group 32, embedding 8w) on vulkan, verified over
decode steps and token for token (``verify_steps``) in ExecuTorch's own Vulkan runtime where one is built here
(docs/vulkan-runtime.md), and on the host emulation everywhere (CI included).

The program is lowered once; ``edgeplug.verify`` picks where it runs at each call (the runtime where found and not
turned off with ``EDGEPLUG_VULKAN_RUNNER=off``). The greedy ids are recomputed here by hand on the quantized
program's own module, so a check that compared the wrong things would fail.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import edgeplug
from edgeplug.plugin import RuntimeNotFound

# slow: optimum-executorch exports the program once for the module (minutes on 2 cores): make test-slow runs it
pytestmark = [pytest.mark.usefixtures("real_vulkan_runtime_env"), pytest.mark.slow]

SEQ, MAX_LEN, TOKENS = 8, 48, 8


@pytest.fixture(scope="module")
def program():
    """A tiny Llama quantized by optimum-executorch's own recipe, exported by its CausalLMExportableModule."""
    integrations = pytest.importorskip("optimum.exporters.executorch.integrations")
    quantization = pytest.importorskip("optimum.exporters.executorch.quantization")
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, max_position_embeddings=MAX_LEN,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static", max_length=MAX_LEN,
        cache_config={"batch_size": 1, "max_cache_len": MAX_LEN},
    )
    quantization.quantize_model_(model, qlinear_config="8da4w", qlinear_group_size=32, qembedding_config="8w",
                                 qembedding_group_size=0)
    ep = integrations.CausalLMExportableModule(
        model, max_seq_len=MAX_LEN, use_custom_sdpa=False, use_custom_kv_cache=False
    ).export()["model"]
    kwargs = {"input_ids": torch.randint(0, 128, (1, SEQ), generator=torch.Generator().manual_seed(2)),
              "cache_position": torch.arange(SEQ)}
    return ep, kwargs


@pytest.fixture(scope="module")
def lowered(program):
    ep, kwargs = program
    return edgeplug.lower(ep, kwargs=kwargs, backend="vulkan")


@pytest.fixture(scope="module")
def greedy_ids(program):
    """Greedy ids of the quantized program itself (its module, the cache carried), one token a decode step."""
    ep, kwargs = program
    module = copy.deepcopy(ep).module()
    ids = []
    with torch.no_grad():
        out = module(**copy.deepcopy(kwargs))
        for k in range(TOKENS):
            ids.append(int(out.reshape(-1, out.shape[-1])[-1].argmax()))
            out = module(input_ids=torch.tensor([[ids[-1]]]), cache_position=torch.tensor([SEQ + k]))
    assert len(set(ids)) > 1  # a generation that says something, not one repeated token
    return ids


@pytest.fixture(scope="module")
def runtime(real_vulkan_runtime_env):
    from edgeplug_vulkan_delegate.runtime import device_runtime

    try:
        return device_runtime()
    except RuntimeNotFound as exc:
        pytest.skip(f"{exc} (tools/vulkan-runtime/build.sh builds one; `make vulkan-runtime` builds it and runs these)")


def _steps_named(v):
    return [o.label for o in v.outputs]


def test_the_quantized_embedding_stays_on_the_cpu(lowered):
    """ExecuTorch's Vulkan runtime has no torchao.dequantize_affine outside its fused linears: the 8w embedding's
    dequantize and lookup run on the CPU (executorch's embedding_byte), each linear stays in a delegate."""
    report = lowered.report
    assert report.cpu_ops["aten.embedding.default"] == 1 and report.cpu_ops["torchao.dequantize_affine.default"] == 1
    reasons = {c.op: c.reason for c in report.cpu_nodes}
    assert "no kernel for torchao.dequantize_affine" in reasons["aten.embedding.default"], reasons
    assert len(report.partitions) == 5 and report.cpu_node_count == 12, report.cpu_ops
    top = [str(n.target) for n in lowered.program.exported_program().graph.nodes if n.op == "call_function"]
    assert any("embedding_byte" in t for t in top) and not any("dequantize_affine" in t for t in top)


def test_prefill_decode_steps_and_greedy_tokens_in_the_real_runtime(lowered, runtime, greedy_ids):
    v = edgeplug.verify(lowered, "vulkan", verify_steps=TOKENS)
    assert v.method == "pte" and v.adapter.startswith(runtime.name), v.adapter
    assert v.passed, v.failures()
    assert _steps_named(v) == ["prefill: output 0", "decode 1: output 0", "decode 2: output 0", "decode 3: output 0"]
    assert all("dynamically quantized activations" in o.tolerance_reason for o in v.outputs)
    g = v.greedy
    assert g.ran and g.runner.startswith(runtime.name) and g.reference == "the quantized model"
    assert g.lowered_ids == g.reference_ids == greedy_ids
    assert f"all {TOKENS} ids agree (ran on {runtime.name} on " in g.summary()


class _Forgetful:
    """ExecuTorch's Vulkan runtime, the program loaded once but its state started afresh before every call: what
    a runtime that does not carry the KV cache between calls does."""

    def __init__(self, runtime) -> None:
        self.runtime, self.name = runtime, f"{runtime.name} (forgetful)"

    def open(self, pte, data=None):
        from edgeplug_vulkan_delegate.runtime import RunnerSession

        session = RunnerSession(pte, data, build=self.runtime.build)
        real_run = session.run

        def run(inputs):
            session.reset()
            return real_run(inputs)[0]

        session.run = run
        return session

    def run(self, pte, data, calls):
        with self.open(pte, data) as session:
            return [session.run(c) for c in calls], session.adapter


def test_a_runtime_that_loses_the_cache_fails_at_the_first_decode_step(lowered, runtime):
    backend = edgeplug.get_backend("vulkan")
    forgetful = dataclasses.replace(backend, spec=backend.spec.model_copy(update={"device_runtime": lambda: _Forgetful(runtime)}))
    v = edgeplug.verify(lowered, forgetful, verify_steps=TOKENS)
    assert not v.passed
    failing = [o.label for o in v.outputs if o.problems]
    assert failing and failing[0] == "decode 1: output 0" and not v.outputs[0].problems, failing
    g = v.greedy
    assert g.ran and g.first_difference == 1 and not g.tie and "(forgetful)" in g.runner, g.summary()
    assert any("first differs at step 1" in line and "FAILED" in line for line in v.failures()), v.failures()


# -- the host emulation: runs everywhere ----------------------------------------------------------------------

def test_prefill_decode_steps_and_greedy_tokens_on_the_host_emulation(lowered, greedy_ids, monkeypatch):
    monkeypatch.setenv("EDGEPLUG_VULKAN_RUNNER", "off")
    v = edgeplug.verify(lowered, "vulkan", verify_steps=TOKENS)
    assert v.method == "kernels" and v.passed, v.failures()
    assert _steps_named(v) == ["prefill: output 0", "decode 1: output 0", "decode 2: output 0", "decode 3: output 0"]
    g = v.greedy
    assert g.ran and g.runner.startswith("host emulation on ") and "EDGEPLUG_VULKAN_RUNNER=off" in g.runner
    assert g.lowered_ids == g.reference_ids == greedy_ids


def test_a_lost_cache_write_fails_decode_and_greedy_on_the_host_emulation(lowered, monkeypatch):
    """Every cache write made functional (each call's keys and values reach its attention, the buffers are left
    as they were): prefill still agrees, decode 1 and the greedy check do not, and each failure is named. (One
    layer's key cache lost moves this tiny random model's decode logits by 6e-3, within the dynamic-activation
    tolerance of 5% of their magnitude, and no greedy id: the check cannot see that, and says so by passing.)"""
    from executorch.exir.dialects._ops import ops

    monkeypatch.setenv("EDGEPLUG_VULKAN_RUNNER", "off")
    result = copy.copy(lowered)
    result.program = copy.deepcopy(lowered.program)
    program = result.lowered_program()  # the program verification runs (executorch's dialect: the writes in place)
    caches = {s.arg.name for s in program.graph_signature.input_specs if "_cache_" in str(s.target)}
    writes = [n for n in program.graph.nodes if "index_put_" in str(n.target) and n.args[0].name in caches]
    assert len(writes) == 4
    for write in writes:
        write.target = ops.edge.aten.index_put.default
    program.graph_module.recompile()
    v = edgeplug.verify(result, "vulkan", verify_steps=TOKENS)
    assert not v.passed and not v.outputs[0].problems
    assert [o.label for o in v.outputs if o.problems][0] == "decode 1: output 0"
    g = v.greedy
    assert g.ran and g.first_difference is not None and g.first_difference >= 1 and not g.tie, g.summary()
