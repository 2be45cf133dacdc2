"""Quantized zoo decoders on the Vulkan delegate family: the host verification reads every quantized
constant the program carries (issue 22).

For each decoder, backend (vulkan, webgpu) and weight-only scheme (PT2E ``w8``: int8 weights with
per-channel scales and zero points as constants; torchao ``w4-g32``: int4 weights in groups of 32,
their scales and zero points inside torchao's tensors), a norm weight element, one scale and one zero
point (made non-zero: both schemes are symmetric, so a dropped zero point would otherwise not show)
are changed in the quantized model; the lowered program runs on the host kernels and must agree with
that model's eager output, and disagree with the model that lacks any one of the changes.

One 1-layer Llama runs by default; ``EDGEPLUG_ZOO=1`` (``make zoo``) runs every zoo decoder.
"""

from __future__ import annotations

import copy
import functools
import os

import pytest
import torch

import edgeplug

WHOLE_SET = os.environ.get("EDGEPLUG_ZOO") == "1"
DECODERS = ["llama", "qwen3", "gemma3", "mistral", "phi3", "olmo2"] if WHOLE_SET else ["llama"]
#: by default one backend and scheme per test (the two tests cover both scheme kinds); the whole set: all
ALL = [(b, s) for b in ("vulkan", "webgpu") for s in ("w8", "w4-g32")]
CASES = ALL if WHOLE_SET else [("vulkan", "w4-g32")]
ZERO_POINT_CASES = ALL if WHOLE_SET else [("vulkan", "w8")]


def _available(backend: str) -> bool:
    return edgeplug.get_backend(backend).availability().ok


@functools.lru_cache(maxsize=None)
def _model(name: str):
    from edgeplug._zoo import build

    return build(name, layers=1)


@functools.lru_cache(maxsize=None)
def _lowered(name: str, backend: str, scheme: str):
    model, inputs = _model(name)
    quantized = edgeplug.quantize(model, inputs, backend, scheme)
    result = edgeplug.lower(quantized, inputs, backend, verify=True)
    return quantized, result


def _graph_module(quantized) -> torch.fx.GraphModule:
    """The quantized program ``edgeplug.quantize`` returned, or the one it wraps."""
    return quantized if isinstance(quantized, torch.fx.GraphModule) else quantized.program


def _attr(quantized, dotted: str):
    return functools.reduce(getattr, dotted.split("."), _graph_module(quantized))


def _norm_weight(quantized) -> str:
    names = [n.target for n in _graph_module(quantized).graph.nodes if n.op == "get_attr" and "norm" in str(n.target)]
    assert names, "the quantized model has no norm weight constant"
    return names[-1]  # the final norm: every logit reads it


def _edits(quantized, scheme: str):
    """(what, change in place) for one norm weight element, one scale and one zero point of the head
    (made non-zero: both schemes are symmetric)."""
    norm = _norm_weight(quantized)
    edits = [("a norm weight", lambda m: _attr(m, norm)[3].add_(0.5))]
    if scheme == "w8":  # PT2E: dequantize_per_channel(int8 weight, scales, zero points), constant operands
        deq = [  # the head's: every logit reads it
            n for n in _graph_module(quantized).graph.nodes
            if n.op == "call_function" and "dequantize_per_channel" in str(n.target)
        ][-1]
        scale, zero_point = deq.args[1].target, deq.args[2].target
        edits += [
            ("a scale", lambda m: _attr(m, scale)[5:6].mul_(1.5)),
            ("a zero point", lambda m: _attr(m, zero_point)[7:8].add_(8)),
        ]
    else:  # torchao: int4 data, scales and zero points inside the head's weight tensor, a group of 32 each
        head = next(
            n.target for n in _graph_module(quantized).graph.nodes
            if n.op == "get_attr" and str(n.target).endswith("lm_head.weight")
        )
        edits += [
            ("a scale", lambda m: _attr(m, head).scale[5, 1:2].mul_(1.5)),
            ("a zero point", lambda m: _attr(m, head).zero_point[7, 0:1].add_(4)),
        ]
    return edits


def _edited(quantized, edits, leave_out: str = ""):
    model = copy.deepcopy(quantized)
    with torch.no_grad():
        for what, change in edits:
            if what != leave_out:
                change(model)
    return model


@pytest.mark.parametrize("backend,scheme", CASES)
@pytest.mark.parametrize("name", DECODERS)
def test_quantized_constants_are_read_as_the_quantized_model_reads_them(name, backend, scheme):
    """The quantized model with a norm weight element, a scale and a non-zero zero point changed lowers
    and verifies against its own eager output; then against the same model with any one of the three
    changes undone, the program disagrees: it read each of them, none was dropped or misread."""
    if not _available(backend):
        pytest.skip(f"{backend}'s host kernels need a wgpu adapter")
    model, inputs = _model(name)
    quantized = edgeplug.quantize(model, inputs, backend, scheme)
    # the delegate's quantized linears are symmetric: a non-zero zero point is the next test's
    edits = [e for e in _edits(quantized, scheme) if e[0] != "a zero point"]
    edited = _edited(quantized, edits)
    result = edgeplug.lower(edited, inputs, backend, verify=True)
    v = result.report.verification
    assert v is not None and v.method == "kernels", v
    assert v.passed, f"{name} {backend} {scheme}: {v.failures()}"
    assert result.report.quantization.reference == "the quantized model's eager output"
    tolerance = v.outputs[0].tolerance
    assert tolerance is not None and v.max_abs_diff <= tolerance
    # every quantized linear went to the delegate: nothing quantized is left for the CPU to compute
    assert not result.report.cpu_ops, result.report.cpu_ops
    with torch.no_grad():
        right = edited(*inputs)
    for what, _ in edits:
        with torch.no_grad():
            without = _edited(quantized, edits, leave_out=what)(*inputs)
        assert (without - right).abs().max().item() > 10 * tolerance, f"changing {what} did not change the model"
        check = edgeplug.verify(result, backend, reference=[without], tolerance=tolerance)
        assert not check.passed, f"{name} {backend} {scheme}: the program ignores {what}"


@pytest.mark.parametrize("backend,scheme", ZERO_POINT_CASES)
def test_a_non_zero_zero_point_is_refused_or_caught_never_dropped(backend, scheme):
    """The delegate's quantized linears are symmetric. A weight with a non-zero zero point stops the
    lowering (PT2E int8: executorch's linear_qcnw refuses it) or its verification (torchao int4: the
    delegate leaves the zero points out of its data, and the host verification names the constant the
    .pte lacks); it is never lowered as if the zero point were 0 and passed."""
    if not _available(backend):
        pytest.skip(f"{backend}'s host kernels need a wgpu adapter")
    model, inputs = _model("llama")
    quantized = edgeplug.quantize(model, inputs, backend, scheme)
    zero_point = [e for e in _edits(quantized, scheme) if e[0] == "a zero point"]
    edited = _edited(quantized, zero_point)
    if scheme == "w8":
        with pytest.raises(edgeplug.LoweringError, match="symmetric quant supported for linear_qcnw"):
            edgeplug.lower(edited, inputs, backend, verify=True)
    else:
        with pytest.raises(edgeplug.VerificationError, match=r"lm_head.*is not in the delegate's named data"):
            edgeplug.lower(edited, inputs, backend, verify=True)
