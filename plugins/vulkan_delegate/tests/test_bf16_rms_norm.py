"""A bf16 RMSNorm lowered for each backend agrees with ExecuTorch's own RMSNorm (issue 15).

The claim: each backend's bf16 RMSNorm stays within one bf16 step of
ExecuTorch's ``executorch.examples.models.llama.norm.RMSNorm`` run in bf16
eager, and is at least as close to an fp64 reference.

- **One bf16 step at a value v** is the spacing of bf16 numbers at v: for
  ``2**e <= |v| < 2**(e+1)`` it is ``2**(e-7)`` (bf16 keeps 8 significant
  bits), i.e. the distance from v to the next bf16 number away from zero; for
  v = 0 and subnormal v it is the subnormal spacing ``2**-133``. The bound is
  elementwise: ``|ours - theirs| <= step(theirs)``.
- **The fp64 reference** is the same formula with every operand in fp64 (the
  bf16 input and weight, exactly widened): ``x * rsqrt(mean(x*x) + eps) * w``.
  Ours must have max and mean |error| no larger than ExecuTorch's.

ExecuTorch's RMSNorm normalises in fp32, rounds to bf16, then multiplies by the
bf16 weight (a second rounding); a fused kernel that applies the weight before
its one rounding is therefore up to one step from it, and closer to fp64.

The inputs cover widths that are and are not multiples of 4 (30, 64, 4096, 3),
ordinary values, large magnitudes (1e15: x*x near 1e30, still finite in fp32),
tiny ones where eps dominates (1e-3 with eps 1e-5) or x*x is subnormal in fp32
(1e-20), and a row of zeros. They run through one program per backend, one
norm per input.

The outputs are read the way ``edgeplug.verify`` reads them, chosen by the
backend's ``BackendSpec.verify_method``: ``"kernels"`` (vulkan, webgpu) through
``edgeplug._verify.host.run_lowered``, the fused op on the wgpu adapter (lavapipe
here) with the backend's own kernel; ``"pte"`` (xnnpack) by loading the
``.pte`` in executorch's Python runtime. ``edgeplug.verify`` with ExecuTorch's
outputs as the reference must then report the same largest difference, so the
test reads what verification reads. qnn and samsung are not run: their
``verify_method`` is ``"none"`` (their runtimes need the vendor SDK and device);
``test_sdk_backends_have_no_host_runtime`` fails once one of them gains a way
to run here, so it can join the comparison.

webgpu runs in ``make test``; vulkan and xnnpack run with ``EDGEPLUG_ZOO=1``.
"""

from __future__ import annotations

import os

import pytest
import torch

import edgeplug

WHOLE_SET = os.environ.get("EDGEPLUG_ZOO") == "1"
DEFAULT = {"webgpu"}
RUNNABLE = ["webgpu", "vulkan", "xnnpack"]
NOT_RUN = {
    "qnn": "the QNN runtime needs the Qualcomm SDK and an HTP device; lowering is a dry run here",
    "samsung": "the Exynos runtime needs Samsung's AI Studio SDK and an Exynos NPU; lowering is a dry run here",
}
FUSED = "et_vk.rms_norm.default"

#: (name, shape, eps, scale of the values): one RMSNorm each
CASES = [
    ("ordinary, width 30", (2, 7, 30), 1e-5, 1.0),
    ("width 4096", (4, 4096), 1e-6, 3.0),
    ("large 1e15, width 64", (3, 64), 1e-5, 1e15),
    ("tiny 1e-3 (eps dominates), width 30", (5, 30), 1e-5, 1e-3),
    ("tiny 1e-20 (x*x subnormal in fp32), width 3", (4, 3), 1e-6, 1e-20),
]


def bf16_step(v: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 numbers at each value of ``v``: 2**(e-7) for 2**e <= |v| < 2**(e+1)."""
    _, exponent = torch.frexp(v.float())  # v = m * 2**exponent with 0.5 <= |m| < 1, so e = exponent - 1
    e = torch.clamp(exponent.to(torch.float64) - 1, min=-126.0)  # below 2**-126: subnormal, spacing 2**-133
    return torch.where(v == 0, torch.tensor(2.0**-133, dtype=torch.float64), torch.exp2(e - 7))


def test_bf16_step_is_the_spacing_of_bf16_numbers():
    """``bf16_step(v)`` is the distance from v to the next bf16 number away from zero, for any finite v."""
    v = torch.tensor(
        [1.0, 1.5, 1.99, 2.0, -1.0, 3.0, 1e-3, -7e4, 1e15, 3e38, 2.0**-126, 2.0**-130, -(2.0**-133), 0.0],
        dtype=torch.bfloat16,
    )
    # bf16 numbers of one sign are ordered like their bit patterns: one more is the next one away from zero
    magnitude = v.abs()
    following = (magnitude.view(torch.int16) + 1).view(torch.bfloat16)
    assert torch.equal(bf16_step(v), following.double() - magnitude.double())
    assert bf16_step(torch.tensor([1.0]))[0] == 2.0**-7 and bf16_step(torch.tensor([2.0]))[0] == 2.0**-6


class Norms(torch.nn.Module):
    """ExecuTorch's RMSNorm, once per case: ``forward(*xs)`` normalises each input with its own norm."""

    def __init__(self) -> None:
        from executorch.examples.models.llama.norm import RMSNorm

        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.norms = torch.nn.ModuleList()
        for _, shape, eps, _ in CASES:
            norm = RMSNorm(shape[-1], eps=eps)
            with torch.no_grad():  # a weight far from ones, so that where it is applied matters
                norm.weight.copy_(1.0 + 0.5 * torch.randn(shape[-1], generator=g))
            self.norms.append(norm)

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(norm(x) for norm, x in zip(self.norms, xs))


def _inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(4)
    xs = []
    for _, shape, _, scale in CASES:
        xs.append((torch.randn(shape, generator=g) * scale).to(torch.bfloat16))
    xs[0][-1, -1] = 0.0  # a row of zeros: rsqrt(eps), times zero
    return tuple(xs)


def _fp64_reference(model: Norms, xs: tuple) -> list[torch.Tensor]:
    out = []
    for norm, x in zip(model.norms, xs):
        x64, w64 = x.double(), norm.weight.double()
        out.append(x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + norm.eps) * w64)
    return out


def _lowered_outputs(result, backend: str) -> tuple[list[torch.Tensor], str]:
    """The program's outputs as ``edgeplug.verify`` obtains them, and where they were computed."""
    method = edgeplug.get_backend(backend).spec.verify_method
    if method == "kernels":
        from edgeplug._verify.host import run_lowered

        run = run_lowered(result, edgeplug.get_backend(backend))
        on_adapter = run.placements.get("adapter", {})
        if not on_adapter.get(FUSED):
            pytest.skip(f"{backend}'s kernel did not run on a wgpu adapter here: {run.note}")
        return list(run.outputs), f"{backend} kernels on {run.adapter}"
    assert method == "pte", method
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    outs = _load_for_executorch_from_buffer(result.buffer).forward(result.runtime_inputs())
    return list(outs), "the .pte in executorch's runtime"


@pytest.fixture(scope="module", params=RUNNABLE)
def compared(request):
    """backend -> (ours, theirs, fp64, where ours ran, report), one lowering per backend."""
    backend = request.param
    if backend not in DEFAULT and not WHOLE_SET:
        pytest.skip("vulkan and xnnpack run with EDGEPLUG_ZOO=1 (`make zoo`); webgpu runs by default")
    if backend not in edgeplug.backends():
        pytest.skip(f"backend {backend!r} is not installed")
    model = Norms().to(torch.bfloat16).eval()
    xs = _inputs()
    with torch.no_grad():
        theirs = list(model(*xs))
    result = edgeplug.lower(model, xs, backend, verify=True, model_name="executorch RMSNorm bf16")
    ours, where = _lowered_outputs(result, backend)
    assert [o.dtype for o in ours] == [torch.bfloat16] * len(CASES), [o.dtype for o in ours]
    # what verification reads is what is compared here: its largest difference against theirs is ours
    check = edgeplug.verify(result, backend, reference=theirs, tolerance=1.0)
    for i, (o, t) in enumerate(zip(ours, theirs)):
        assert check.outputs[i].max_abs_diff == (o.double() - t.double()).abs().max().item(), (i, check)
    return ours, theirs, _fp64_reference(model, xs), where, result.report


@pytest.mark.slow
def test_within_one_bf16_step_of_executorch_rms_norm(compared):
    ours, theirs, _, where, report = compared
    assert report.verification is not None and report.verification.passed, report.to_table()
    for (name, *_), o, t in zip(CASES, ours, theirs):
        diff = (o.double() - t.double()).abs()
        step = bf16_step(t)
        worst = int(torch.argmax(diff / step))
        assert bool((diff <= step).all()), (
            f"{name}: {int((diff > step).sum())} of {diff.numel()} values are more than one bf16 step from "
            f"ExecuTorch's RMSNorm ({where}); worst: ours {o.flatten()[worst].item()!r}, "
            f"theirs {t.flatten()[worst].item()!r}, step {step.flatten()[worst].item()!r}\n{report.to_table()}"
        )


@pytest.mark.slow
def test_at_least_as_close_to_fp64_as_executorch_rms_norm(compared):
    ours, theirs, ref, where, _ = compared
    for (name, *_), o, t, r in zip(CASES, ours, theirs, ref):
        ours_err, theirs_err = (o.double() - r).abs(), (t.double() - r).abs()
        assert ours_err.max() <= theirs_err.max(), (
            f"{name}: max |error| vs fp64 {ours_err.max().item():.4g} ({where}) > ExecuTorch's {theirs_err.max().item():.4g}"
        )
        assert ours_err.mean() <= theirs_err.mean(), (
            f"{name}: mean |error| vs fp64 {ours_err.mean().item():.4g} ({where}) > ExecuTorch's {theirs_err.mean().item():.4g}"
        )


@pytest.mark.slow
def test_vulkan_and_webgpu_run_the_fused_norm_on_the_adapter(compared):
    """On vulkan/webgpu the comparison is of the backend's fused kernel, not of torch running the graph."""
    _, _, _, where, report = compared
    if report.backend == "xnnpack":
        pytest.skip("xnnpack has no rms_norm fusion: its .pte runs the decomposed norm")
    fused = [f for f in report.fusions if str(f.outcome) != "rejected"]
    assert len(fused) == len(CASES), report.to_table()
    assert report.delegated_ops.get(FUSED) == len(CASES), report.to_table()
    assert "on the adapter" in report.verification.note and "kernels on" in where, report.verification.note


@pytest.mark.parametrize("backend", sorted(NOT_RUN))
def test_sdk_backends_have_no_host_runtime(backend):
    """Why qnn and samsung are not compared: nothing runs their programs on this host."""
    if backend not in edgeplug.backends():
        pytest.skip(f"backend {backend!r} is not installed")
    assert edgeplug.get_backend(backend).spec.verify_method == "none", (
        f"{backend} can now run its programs here: add it to RUNNABLE ({NOT_RUN[backend]} no longer holds)"
    )
