"""The test suite every ``et_vk.rms_norm`` kernel runs: behaviour, not implementation.

The suite takes the kernel the backend registers (its ``Kernel`` record, so
what is tested is what host verification calls) and checks it against a
float64 reference: outputs, shapes and dtypes, the eps it defaults to and the
eps it is given, leading dimensions and non-contiguous inputs, empty inputs,
and that bad arguments raise ``edgeplug.plugin.KernelError`` naming the
backend, the op and the bad value before anything is dispatched.

Use it by subclassing in one of your plugin's test modules::

    from edgeplug_vulkan_delegate.testing import RmsNormKernelSuite

    class TestMyRmsNorm(RmsNormKernelSuite):
        backend = "mybackend"
        op = "et_vk.rms_norm.default"       # the op your Kernel record names
        dtypes = (torch.float32,)           # storage dtypes the kernel takes

pytest collects the inherited tests for the subclass. The vulkan and webgpu
plugins run exactly this suite (the messages it expects are
``kernel_contract.check_args``'s); tests of what is their own choice
(shader source, workgroup shapes, the runtime's contract for weights) stay
next to it in their own test modules.
"""

from __future__ import annotations

import os
from typing import Any, Callable, ClassVar

import pytest
import torch

from edgeplug.plugin import KernelError

__all__ = ["RmsNormKernelSuite", "rms_norm_reference"]


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x**2, -1) + eps) * weight`` computed in float64, returned in x's dtype."""
    x64, w64 = x.to(torch.float64), weight.to(torch.float64)
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w64
    return y.to(x.dtype)


def _inputs(rows: int, width: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, width, generator=g, dtype=torch.float64) * 3).to(dtype)
    w = (1 + 0.5 * torch.randn(width, generator=g, dtype=torch.float64)).to(dtype)
    return x, w


#: (description, call(kernel, dtype) -> None, text the error must contain)
_BAD: list[tuple[str, Callable[[Any, torch.dtype], Any], str]] = [
    ("x not a tensor", lambda k, d: k([1.0, 2.0], torch.ones(2, dtype=d), 1e-6), "x must be a torch.Tensor, got list"),
    ("0-d x", lambda k, d: k(torch.tensor(1.0, dtype=d), torch.ones(1, dtype=d), 1e-6), "0-d tensor"),
    ("empty last dim", lambda k, d: k(torch.ones(3, 0, dtype=d), torch.ones(0, dtype=d), 1e-6), "shape (3, 0)"),
    ("weight None", lambda k, d: k(torch.ones(2, 4, dtype=d), None, 1e-6), "weight is None"),
    ("weight too long", lambda k, d: k(torch.ones(2, 4, dtype=d), torch.ones(5, dtype=d), 1e-6), "weight has shape (5,), but x's last dimension is 4"),
    ("weight of one", lambda k, d: k(torch.ones(2, 4, dtype=d), torch.ones(1, dtype=d), 1e-6), "weight has shape (1,)"),
    ("weight 2-d", lambda k, d: k(torch.ones(2, 4, dtype=d), torch.ones(2, 4, dtype=d), 1e-6), "weight has shape (2, 4)"),
    ("negative eps", lambda k, d: k(torch.ones(2, 4, dtype=d), torch.ones(4, dtype=d), -1e-6), "eps is -1e-06"),
    ("nan eps", lambda k, d: k(torch.ones(2, 4, dtype=d), torch.ones(4, dtype=d), float("nan")), "eps is nan"),
    ("inf eps", lambda k, d: k(torch.ones(2, 4, dtype=d), torch.ones(4, dtype=d), float("inf")), "eps is inf"),
    ("eps a string", lambda k, d: k(torch.ones(2, 4, dtype=d), torch.ones(4, dtype=d), "1e-6"), "eps must be a number, got str"),
]


class RmsNormKernelSuite:
    """The shared tests of an ``rms_norm(x, weight, eps=None)`` kernel; subclass and set ``backend``."""

    #: the backend whose Kernel record is tested
    backend: ClassVar[str] = ""
    #: the op the Kernel record names
    op: ClassVar[str] = "et_vk.rms_norm.default"
    #: device of the Kernel record (None: any)
    device: ClassVar[Any] = None
    #: storage dtypes the kernel takes; every other float dtype must be refused
    dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32,)
    #: (rtol, atol) against the float64 reference, per dtype
    tolerance: ClassVar[dict[torch.dtype, tuple[float, float]]] = {
        torch.float32: (1e-5, 1e-5),
        torch.float16: (2e-3, 2e-3),
        torch.bfloat16: (1.6e-2, 1.6e-2),
    }
    #: row widths to cover: 1, not a multiple of 4, a multiple of 4, wide, wide and odd
    widths: ClassVar[tuple[int, ...]] = (1, 3, 4, 7, 64, 4096, 5000)

    # -- fixtures ---------------------------------------------------------------
    @pytest.fixture(scope="class")
    def kernel(self) -> Callable[..., torch.Tensor]:
        """The impl of the backend's Kernel record for ``op``."""
        import edgeplug

        assert self.backend, f"{type(self).__name__} must set backend = '<name>'"
        record = edgeplug.get_backend(self.backend).kernel(self.op, self.device)
        assert record is not None, f"backend {self.backend!r} registers no kernel for {self.op!r}"
        return record.impl

    def where(self) -> str:
        """What every error must name: the backend and the op."""
        return f"{self.backend} {self.op}"

    def check(self, y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, eps: float) -> None:
        assert isinstance(y, torch.Tensor), f"the kernel returned {type(y).__name__}, not a tensor"
        assert y.shape == x.shape, f"output shape {tuple(y.shape)} != input shape {tuple(x.shape)}"
        assert y.dtype == x.dtype, f"output dtype {y.dtype} != input dtype {x.dtype}"
        rtol, atol = self.tolerance[x.dtype]
        torch.testing.assert_close(y.to(torch.float64), rms_norm_reference(x, w, eps).to(torch.float64), rtol=rtol, atol=atol)

    # -- outputs ------------------------------------------------------------------
    def test_matches_the_float64_reference_at_every_width(self, kernel):
        for width in self.widths:
            x, w = _inputs(5, width)
            self.check(kernel(x, w, 1e-6), x, w, 1e-6)

    def test_every_storage_dtype_it_takes(self, kernel):
        for dtype in self.dtypes:
            for width in (3, 64, 5000):
                x, w = _inputs(4, width, dtype, seed=width)
                self.check(kernel(x, w, 1e-5), x, w, 1e-5)

    def test_other_dtypes_are_refused_naming_the_dtype(self, kernel):
        others = [d for d in (torch.float16, torch.bfloat16, torch.float64, torch.int32) if d not in self.dtypes]
        assert others, "the suite needs a dtype the kernel refuses"
        for dtype in others:
            with pytest.raises(KernelError) as err:
                kernel(torch.ones(2, 4, dtype=dtype), torch.ones(4, dtype=dtype), 1e-6)
            text = str(err.value)
            assert self.where() in text and f"dtype {str(dtype).replace('torch.', '')}" in text, text

    def test_weight_dtype_must_match(self, kernel):
        other = torch.float16 if self.dtypes[0] != torch.float16 else torch.float32
        x = torch.ones(2, 4, dtype=self.dtypes[0])
        with pytest.raises(KernelError, match="weight has dtype"):
            kernel(x, torch.ones(4, dtype=other), 1e-6)

    # -- eps ------------------------------------------------------------------------
    def test_eps_none_is_float32_machine_epsilon(self, kernel):
        x = torch.full((2, 8), 1e-4)  # mean of squares 1e-8: eps decides the result
        w = torch.ones(8)
        y = kernel(x, w)
        self.check(y, x, w, float(torch.finfo(torch.float32).eps))
        assert not torch.allclose(y, rms_norm_reference(x, w, 1e-6), rtol=1e-3)

    def test_the_eps_given_is_used(self, kernel):
        x = torch.full((2, 8), 1e-2)
        w = torch.ones(8)
        small, large = kernel(x, w, 1e-8), kernel(x, w, 1e-2)
        self.check(small, x, w, 1e-8)
        self.check(large, x, w, 1e-2)
        assert not torch.allclose(small, large)

    # -- shapes -----------------------------------------------------------------------
    def test_leading_dimensions_and_non_contiguous_input(self, kernel):
        g = torch.Generator().manual_seed(3)
        x = torch.randn(6, 2, 64, generator=g).transpose(0, 1)  # (2, 6, 64), not contiguous
        w = torch.randn(64, generator=g)
        assert not x.is_contiguous()
        self.check(kernel(x, w, 1e-6), x, w, 1e-6)

    def test_every_row_is_written(self, kernel):
        for rows in (1, 2, 3, 17, 257):
            x, w = _inputs(rows, 12, seed=rows)
            y = kernel(x, w, 1e-6)
            self.check(y, x, w, 1e-6)
            assert torch.isfinite(y[-1]).all() and y[-1].abs().sum() > 0

    def test_zero_rows_return_an_empty_tensor(self, kernel):
        y = kernel(torch.empty(0, 16), torch.ones(16), 1e-6)
        assert isinstance(y, torch.Tensor) and y.shape == (0, 16) and y.dtype == torch.float32

    # -- bad arguments ------------------------------------------------------------------
    @pytest.mark.parametrize("what, call, message", _BAD, ids=[b[0] for b in _BAD])
    def test_bad_arguments_fail_before_dispatch_naming_op_and_value(self, kernel, what, call, message):
        with pytest.raises(KernelError) as err:
            call(kernel, self.dtypes[0])
        text = str(err.value)
        assert self.where() in text, f"the error does not name {self.where()!r}: {text}"
        assert message in text, text
        assert len(text) < 2000, "an argument error should be a sentence, not a dump"


# -- which runner verification uses in a test session -------------------------------------------------

#: the variables that point at (or turn off) ExecuTorch's Vulkan and WebGPU runtimes (runtime.VULKAN, WEBGPU)
_RUNNER_VARIABLES = ("EDGEPLUG_VULKAN_RUNNER", "EDGEPLUG_WEBGPU_RUNNER")
_RUNNER_GIVEN = {v: os.environ.get(v) for v in _RUNNER_VARIABLES}


@pytest.fixture(scope="session", autouse=True)
def host_emulation_session():
    """Import into a conftest: its tests verify on the host emulation, ExecuTorch's Vulkan and WebGPU runtimes
    (where built) turned off for the session, before any fixture lowers (``EDGEPLUG_VULKAN_RUNNER=off``,
    ``EDGEPLUG_WEBGPU_RUNNER=off``)."""
    with pytest.MonkeyPatch.context() as mp:
        for variable in _RUNNER_VARIABLES:
            mp.setenv(variable, "off")
        yield


def _as_the_shell_set_it(variable: str):
    with pytest.MonkeyPatch.context() as mp:
        given = _RUNNER_GIVEN[variable]
        if given is None:
            mp.delenv(variable, raising=False)
        else:
            mp.setenv(variable, given)
        yield


@pytest.fixture(scope="module")
def real_vulkan_runtime_env():
    """For a module that runs programs in ExecuTorch's Vulkan runtime: its variable back as the shell set it
    (or unset)."""
    yield from _as_the_shell_set_it("EDGEPLUG_VULKAN_RUNNER")


@pytest.fixture(scope="module")
def real_webgpu_runtime_env():
    """For a module that runs programs in ExecuTorch's WebGPU runtime: its variable back as the shell set it
    (or unset)."""
    yield from _as_the_shell_set_it("EDGEPLUG_WEBGPU_RUNNER")


def owning_buffers(backend: Any) -> Any:
    """``backend`` as it would be if its runtime kept a buffer moved into its delegate: ``delegate_buffers=True``,
    no runtime of its own (so no constant copies for one). Neither of ExecuTorch's runtimes keeps such a buffer
    (Vulkan's refuses the call, WebGPU's crashes), so vulkan and webgpu keep every written buffer a program
    input; tests reach the core's other path, and the WebGPU runtime's gap, through this."""
    import dataclasses

    spec = backend.spec.model_copy(update={"delegate_buffers": True, "copy_shared_constants": False, "device_runtime": None})
    return dataclasses.replace(backend, spec=spec)
