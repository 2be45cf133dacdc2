"""RMSNorm spellings the core fuses, and the near-misses it must refuse.

A catalogue for tests of ``edgeplug._fusion.rms_norm.match_rms_norm`` and
``edgeplug.fuse``, usable by plugin authors to check their backend's policy.
Each ``Case`` builds one small module computing one norm; ``Bundle`` puts many
cases side by side in one module, because an export through ``to_edge`` costs
about a second whatever the model's size::

    bundle = Bundle(ACCEPTED)
    ep = bundle.edge_program()                 # one export for every case
    fused, records = edgeplug.fuse(ep, "mybackend")
    for case, node in zip(bundle.cases, bundle.output_nodes(fused)): ...

The catalogue:

``Case``
    One norm and what the core must make of it (accepted or refused with a reason, eps, weight source).
``CaseModule``
    The seeded parameters every case may use; ``Case.module`` builds one.
``Bundle``
    Many cases in one module, one output each, with ``edge_program`` to export them together.
``ACCEPTED``
    Every spelling the core must fuse (``SCALED`` and ``ROUNDED`` included).
``SCALED``
    A norm times something that is not a ``[D]`` weight: the norm fuses alone, the multiply stays.
``ROUNDED``
    A rounding between the norm and its weight: the norm fuses with a unit weight.
``WHOLE``
    ``aten.rms_norm`` kept whole through export.
``REJECTED``
    Near-misses the matcher must refuse with a reason.
``UNRELATED``
    Code that looks a little like a norm: no match and nothing to report.
``D``
    The size of the normalised axis in every case; ``EPS`` the eps most cases use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)
import torch.nn.functional as F
from executorch.exir import EdgeCompileConfig, to_edge
from torch import nn

__all__ = ["ACCEPTED", "Bundle", "Case", "CaseModule", "D", "EPS", "REJECTED", "ROUNDED", "SCALED", "UNRELATED", "WHOLE"]

#: the size of the normalised axis in every case
D = 16
EPS = 1e-6


def _norm(x: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class CaseModule(nn.Module):
    """Parameters every case may use, seeded; ``fn(self, x, *extra)`` is the case."""

    def __init__(self, fn: Callable[..., torch.Tensor], dtype: torch.dtype, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)

        def p(*shape: int, scale: float = 1.0, base: float = 0.0) -> nn.Parameter:
            return nn.Parameter((base + scale * torch.randn(*shape, generator=g)).to(dtype))

        self.fn = fn
        self.w = p(D, scale=0.1, base=1.0)
        self.dw = p(D, scale=0.1)  # Gemma stores w - 1
        self.w1 = p(1, scale=0.1, base=1.0)
        self.w4 = p(4, D, scale=0.1, base=1.0)
        self.w3d = p(1, 1, D, scale=0.1, base=1.0)
        self.b = p(D, scale=0.1)
        self.nn_norm = nn.RMSNorm(D, eps=1e-5).to(dtype)
        self.nn_norm_default = nn.RMSNorm(D).to(dtype)
        self.nn_norm_plain = nn.RMSNorm(D, eps=1e-5, elementwise_affine=False).to(dtype)
        with torch.no_grad():
            self.nn_norm.weight.copy_(1 + 0.1 * torch.randn(D, generator=g))
            self.nn_norm_default.weight.copy_(1 + 0.1 * torch.randn(D, generator=g))
        # a 0-d parameter (differential attention's lambda)
        self.lam = nn.Parameter((0.5 + 0.1 * torch.randn((), generator=g)).to(dtype))

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        return self.fn(self, x, *extra)


@dataclass(frozen=True)
class Case:
    """One norm, and what the core must make of it."""

    name: str
    fn: Callable[..., torch.Tensor]
    #: the matcher accepts it
    accept: bool = True
    #: for a refused case: a piece of the reason the matcher gives
    reason: str = ""
    #: the eps the fused op must carry (None: not checked)
    eps: Optional[float] = EPS
    #: where the weight comes from: "leaf", "computed", "runtime" or None (no weight)
    weight: Optional[str] = "leaf"
    #: the value the fused op's weight must hold, from the case module (None: ones)
    weight_value: Optional[Callable[[CaseModule], torch.Tensor]] = None
    #: input dtype, input shape, and shapes of extra runtime inputs
    dtype: torch.dtype = torch.float32
    shape: tuple[int, ...] = (2, 8, D)
    extra: tuple[tuple[int, ...], ...] = ()
    #: aten.rms_norm kept whole (export with ``preserve_ops``)
    whole: bool = False
    #: the norm is multiplied by something that is not a ``[D]`` weight (a scalar, a
    #: ``(1,)`` or ``(4, D)`` tensor, a per-batch scale): fused alone, the multiply stays
    scale: bool = False

    def module(self, seed: int = 0) -> CaseModule:
        return CaseModule(self.fn, self.dtype, seed).eval()

    def inputs(self, seed: int = 0) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(1000 + seed)
        x = (2 * torch.randn(*self.shape, generator=g)).to(self.dtype)
        extra = tuple((0.1 * torch.rand(*s, generator=g)).to(self.dtype) for s in self.extra)
        return (x, *extra)

    def tolerance(self) -> float:
        return 2e-2 if self.dtype in (torch.float16, torch.bfloat16) else 1e-5


def _w(m: CaseModule) -> torch.Tensor:
    return m.w


def _also_used(normed: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return normed * w + normed  # a second user of the norm's output keeps the multiply out of the match


#: every spelling of RMSNorm the core must fuse
ACCEPTED: tuple[Case, ...] = (
    Case("rsqrt", lambda m, x: _norm(x) * m.w, weight_value=_w),
    Case("weight_on_the_left", lambda m, x: m.w * _norm(x), weight_value=_w),
    Case(
        "pow_minus_half",
        lambda m, x: x * torch.pow((x * x).mean(-1, keepdim=True) + EPS, -0.5) * m.w,
        weight_value=_w,
    ),
    Case(
        "one_over_sqrt",
        lambda m, x: x * (1 / torch.sqrt(torch.square(x).mean(-1, keepdim=True) + EPS)) * m.w,
        weight_value=_w,
    ),
    # pow.Tensor_Tensor with a constant exponent (what a quantizer's annotation pipeline writes)
    Case(
        "pow_tensor_exponent",
        lambda m, x: x * torch.rsqrt(x.pow(torch.tensor(2.0)).mean(-1, keepdim=True) + EPS) * m.w,
        weight_value=_w,
    ),
    Case("x_over_sqrt", lambda m, x: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * m.w, weight_value=_w),
    Case("eps_first", lambda m, x: x * torch.rsqrt(EPS + x.pow(2).mean(-1, keepdim=True)) * m.w, weight_value=_w),
    Case(
        "eps_lifted_tensor",
        lambda m, x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + torch.tensor(EPS)) * m.w,
        weight_value=_w,
    ),
    Case("axis_ndim_minus_1", lambda m, x: x * torch.rsqrt(x.pow(2).mean(2, keepdim=True) + EPS) * m.w, weight_value=_w),
    Case("no_eps", lambda m, x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) * m.w, eps=0.0, weight_value=_w),
    Case("nn_rmsnorm", lambda m, x: m.nn_norm(x), eps=1e-5, weight_value=lambda m: m.nn_norm.weight),
    Case(
        "nn_rmsnorm_default_eps",
        lambda m, x: m.nn_norm_default(x),
        eps=float(torch.finfo(torch.float32).eps),
        weight_value=lambda m: m.nn_norm_default.weight,
    ),
    Case("f_rms_norm", lambda m, x: F.rms_norm(x, (D,), m.w, 1e-5), eps=1e-5, weight_value=_w),
    Case("no_weight", lambda m, x: _norm(x) + 1.0, weight=None),
    # the norm's output feeds the weight multiply and something else: fused alone, the multiply stays
    Case("norm_output_also_used", lambda m, x: _also_used(_norm(x), m.w), weight=None),
    Case("f_rms_norm_no_weight", lambda m, x: F.rms_norm(x, (D,), eps=EPS), weight=None),
    Case("gemma_one_plus_w", lambda m, x: _norm(x) * (1.0 + m.dw), weight="computed", weight_value=lambda m: 1.0 + m.dw),
    Case("static_view", lambda m, x: _norm(x) * m.w.view(1, 1, D), weight="computed", weight_value=_w),
    Case("leading_ones_weight", lambda m, x: _norm(x) * m.w3d, weight="leaf", weight_value=lambda m: m.w3d.view(D)),
    Case("runtime_scale", lambda m, x, s: _norm(x) * (1 + s), weight="runtime", extra=((1, 1, D),)),
    Case("graph_input_gamma", lambda m, x, g: _norm(x) * g, weight="runtime", extra=((D,),)),
    Case(
        "fp16_upcast",
        lambda m, x: _norm(x.float()).to(x.dtype) * m.w,
        dtype=torch.float16,
        weight_value=_w,
    ),
    # a bf16 1 + w after the norm's cast back: folded into an fp32 constant where the norm stays fp32
    Case(
        "bf16_gemma_after_cast",
        lambda m, x: _norm(x.float()).to(x.dtype) * (1.0 + m.dw),
        dtype=torch.bfloat16,
        weight="computed",
        weight_value=lambda m: 1.0 + m.dw,
    ),
    Case(
        "fp16_gemma_upcast",
        lambda m, x: (_norm(x.float()) * (1.0 + m.dw.float())).type_as(x),
        dtype=torch.float16,
        weight="computed",
        weight_value=lambda m: 1.0 + m.dw.float(),
    ),
)

def _fake_quant(t: torch.Tensor) -> torch.Tensor:
    qd = torch.ops.quantized_decomposed
    q = qd.quantize_per_tensor(t, 0.02, 0, -128, 127, torch.int8)
    return qd.dequantize_per_tensor(q, 0.02, 0, -128, 127, torch.int8)


#: a norm times something that is not a ``[D]`` weight: the norm fuses alone (with a unit
#: weight) and the multiply stays as it is
SCALED: tuple[Case, ...] = (
    Case("weight_of_shape_1", lambda m, x: _norm(x) * m.w1, weight=None, scale=True),
    Case("weight_of_shape_4xD", lambda m, x: _norm(x) * m.w4, weight=None, scale=True, shape=(2, 4, D)),
    Case("scalar_parameter_scale", lambda m, x: _norm(x) * (1 - m.lam), weight=None, scale=True),
    Case(
        "per_batch_runtime_scale",
        lambda m, x, s: _norm(x) * (1 + s),
        weight=None,
        scale=True,
        extra=((2, 1, D),),
    ),
)

ACCEPTED = ACCEPTED + SCALED

#: spellings that match but round the norm's output before the weight multiply: the
#: norm fuses with a unit weight and the rounding and the multiply stay
ROUNDED: tuple[Case, ...] = (
    Case("qdq_between", lambda m, x: _fake_quant(_norm(x)) * m.w, weight_value=_w),
    Case("roundtrip_fp16_between", lambda m, x: _norm(x).half().float() * m.w, weight_value=_w),
)

ACCEPTED = ACCEPTED + ROUNDED

#: aten.rms_norm kept whole (QNN and Samsung keep it; others meet it in preserved programs)
WHOLE: tuple[Case, ...] = (
    Case("whole_nn_rmsnorm", lambda m, x: m.nn_norm(x), eps=1e-5, weight_value=lambda m: m.nn_norm.weight, whole=True),
    Case(
        "whole_default_eps",
        lambda m, x: F.rms_norm(x, (D,), m.w),
        eps=float(torch.finfo(torch.float32).eps),
        weight_value=_w,
        whole=True,
    ),
    Case(
        "whole_fp16_default_eps",
        lambda m, x: F.rms_norm(x, (D,), m.w),
        eps=float(torch.finfo(torch.float16).eps),
        weight_value=_w,
        dtype=torch.float16,
        whole=True,
    ),
    Case("whole_times_weight", lambda m, x: m.nn_norm_plain(x) * m.w, eps=1e-5, weight_value=_w, whole=True),
    Case(
        "whole_computed_weight",
        lambda m, x: F.rms_norm(x, (D,), 1.0 + m.dw, EPS),
        weight="computed",
        weight_value=lambda m: 1.0 + m.dw,
        whole=True,
    ),
    Case("whole_no_weight", lambda m, x: F.rms_norm(x, (D,), eps=EPS), weight=None, whole=True),
    Case("whole_runtime_weight", lambda m, x, g: F.rms_norm(x, (D,), g, EPS), weight="runtime", extra=((D,),), whole=True),
    Case(
        "whole_two_axes",
        lambda m, x: F.rms_norm(x, (4, D), m.w4, EPS),
        accept=False,
        reason="spans 2 axes",
        shape=(2, 4, D),
        whole=True,
    ),
)

#: near-misses: each must be refused with a reason (and never fused)
REJECTED: tuple[Case, ...] = (
    Case("relu_between", lambda m, x: torch.relu(_norm(x)) * m.w, accept=False, reason="aten.relu.default"),
    Case("bias_between", lambda m, x: (_norm(x) + m.b) * m.w, accept=False, reason="aten.add.Tensor"),
    Case("tanh_between", lambda m, x: torch.tanh(_norm(x)) * m.w, accept=False, reason="aten.tanh.default"),
    Case(
        "mean_over_axis_1",
        lambda m, x: x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + EPS) * m.w,
        accept=False,
        reason="not the last axis",
    ),
    Case(
        "mean_over_two_axes",
        lambda m, x: x * torch.rsqrt(x.pow(2).mean((1, 2), keepdim=True) + EPS) * m.w,
        accept=False,
        reason="reduces axes [1, 2]",
    ),
    Case(
        "keepdim_false",
        lambda m, x: x * torch.rsqrt(x.pow(2).mean(-1) + EPS) * m.w,
        accept=False,
        reason="keepdim=False",
        shape=(D, D),
    ),
    Case(
        "different_tensors",
        lambda m, x: x * torch.rsqrt((x + 1).pow(2).mean(-1, keepdim=True) + EPS) * m.w,
        accept=False,
        reason="different tensors",
    ),
    Case(
        "mean_not_of_square",
        lambda m, x: x * torch.rsqrt(x.abs().mean(-1, keepdim=True) + EPS) * m.w,
        accept=False,
        reason="not over a square",
    ),
    Case(
        "cube",
        lambda m, x: x * torch.rsqrt(x.abs().pow(3).mean(-1, keepdim=True) + EPS) * m.w,
        accept=False,
        reason="power 3",
    ),
    Case(
        "pow_minus_quarter",
        lambda m, x: x * torch.pow(x.pow(2).mean(-1, keepdim=True) + EPS, -0.25) * m.w,
        accept=False,
        reason="-0.25",
    ),
    Case(
        "downcast_before",
        lambda m, x: x * torch.rsqrt(x.half().float().pow(2).mean(-1, keepdim=True) + EPS) * m.w,
        accept=False,
        reason="casts to float16 before the math",
    ),
    Case(
        "negative_eps",
        lambda m, x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + (-1e-3)) * m.w,
        accept=False,
        reason="finite and non-negative",
    ),
    Case(
        "nan_eps",
        lambda m, x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + float("nan")) * m.w,
        accept=False,
        reason="finite and non-negative",
    ),
    Case(
        "inf_eps",
        lambda m, x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + float("inf")) * m.w,
        accept=False,
        reason="finite and non-negative",
    ),
    Case(
        "runtime_eps",
        lambda m, x, e: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + e) * m.w,
        accept=False,
        reason="computed at runtime",
        extra=((1,),),
    ),
    Case(
        "eps_of_shape_1",
        lambda m, x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + torch.full((1,), EPS)) * m.w,
        accept=False,
        reason="not a compile-time scalar",
    ),
    Case(
        "alpha_2",
        lambda m, x: x * torch.rsqrt(torch.add(x.pow(2).mean(-1, keepdim=True), EPS, alpha=2)) * m.w,
        accept=False,
        reason="alpha=2",
    ),
    Case(
        "qdq_inside_the_norm",
        lambda m, x: _fake_quant(x) * _fake_quant(torch.rsqrt(_fake_quant(x.pow(2).mean(-1, keepdim=True)) + EPS)) * m.w,
        accept=False,
        reason="Quantize with edgeplug.quantize so the norm is recomposed before annotation",
    ),
)


class Bundle(nn.Module):
    """Many cases side by side: ``forward`` returns one output per case, in order."""

    def __init__(self, cases: tuple[Case, ...] | list[Case], seed: int = 0) -> None:
        super().__init__()
        self.cases = list(cases)
        self.parts = nn.ModuleList(c.module(seed + i) for i, c in enumerate(self.cases))
        self.seed = seed

    def inputs(self) -> tuple[torch.Tensor, ...]:
        return tuple(t for i, c in enumerate(self.cases) for t in c.inputs(self.seed + i))

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs, i = [], 0
        for case, part in zip(self.cases, self.parts):
            n = 1 + len(case.extra)
            outs.append(part(*args[i : i + n]))
            i += n
        return tuple(outs)

    def edge_program(self) -> Any:
        """``to_edge(export(self))``, keeping ``aten.rms_norm`` whole when a case asks for it."""
        keep = [torch.ops.aten.rms_norm.default] if any(c.whole for c in self.cases) else []
        with torch.no_grad():
            ep = torch.export.export(self, self.inputs())
        return to_edge(ep, compile_config=EdgeCompileConfig(preserve_ops=keep)).exported_program()

    def output_nodes(self, ep: Any) -> list[torch.fx.Node]:
        """The node producing each case's output in ``ep``'s graph."""
        out = next(n for n in ep.graph_module.graph.nodes if n.op == "output")
        return list(out.args[0])

    def case_of(self, ep: Any) -> dict[torch.fx.Node, Case]:
        """Which case each node of ``ep`` belongs to (the output it flows into)."""
        owner: dict[torch.fx.Node, Case] = {}
        for node, case in zip(self.output_nodes(ep), self.cases):
            stack = [node]
            while stack:
                n = stack.pop()
                if n not in owner:
                    owner[n] = case
                    stack.extend(n.all_input_nodes)
        return owner


#: look a little like a norm but are not one: no match and nothing to report
UNRELATED: tuple[Case, ...] = (
    Case("rsqrt_of_input", lambda m, x, y: x * torch.rsqrt(y.abs() + EPS), accept=False, extra=((2, 8, 1),)),
    Case("over_sqrt_of_sum", lambda m, x: x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + EPS), accept=False),
    Case("attention_scale", lambda m, x: (x @ x.transpose(-1, -2)) * torch.rsqrt(torch.tensor(16.0)), accept=False),
)
