"""Property tests: RMSNorm-like graphs with random perturbations, fused under every policy.

Hypothesis draws a handful of norms per example, each a random spelling with
random perturbations (another axis, keepdim=False, a different tensor squared,
a downcast, a bad eps or alpha, an op between the norm and the weight, a
weight of the wrong shape, ...). All of them go into one module (one export
per example). Then, for every policy kind (the fixture backends': ``aten.rms_norm``
kept whole; a backend's own fused op accumulating in fp32; the same op without
fp32 accumulation):

* whenever ``fuse`` changes the graph, the outputs match eager within the
  dtype's tolerance, and a norm it did not fuse computes bit for bit what the
  input program computes;
* a plain RMSNorm in an accepted spelling always fuses, and a perturbed one
  never does.

``EDGEPLUG_PROPERTY_EXAMPLES`` sets the number of examples (default 8).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Optional

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import edgeplug
from edgeplug._fusion.nodes import is_op

D = 16
SHAPE = (2, 4, D)
#: (fixture backend, policy changes): a kept-whole aten op, an own op in fp32, an own op without fp32 accumulation
POLICIES = [("fixture-keep", {}), ("fixture-fused", {}), ("fixture-fused", {"fp32_accumulation": False})]
EXAMPLES = int(os.environ.get("EDGEPLUG_PROPERTY_EXAMPLES", "8"))
FUSED = ("fused", "folded_weight", "fused_unit_weight")


@dataclass(frozen=True)
class Norm:
    inverse: str  # rsqrt, pow, recip, div
    square: str  # mul, pow2, square
    eps: Optional[float]  # None: no eps at all
    eps_form: str  # literal, tensor
    eps_left: bool
    alpha: int
    axis: str  # last, ndim-1, other
    keepdim: bool
    squared: str  # same, shifted, downcast
    between: str  # none, casts, roundtrip (through fp16), relu, bias
    weight: str  # leaf, left, gemma, view, leading_ones, runtime, none, shape1 (not a weight: a scale)
    fp16: bool  # fp16 input, math in an fp32 upcast, cast back before the weight

    @property
    def plain(self) -> bool:
        """An RMSNorm in an accepted spelling: it must fuse."""
        return (
            self.squared == "same"
            and (self.eps is None or (math.isfinite(self.eps) and self.eps >= 0))
            and self.alpha == 1
            and self.axis in ("last", "ndim-1")
            and self.keepdim
            # an op between the norm and a [D] weight blocks the fusion; with no weight (or a
            # scale that is not one) after it, the norm fuses alone and the op stays
            and (self.between in ("none", "casts", "roundtrip") or self.weight in ("none", "shape1"))
        )

    @property
    def tolerance(self) -> float:
        return 2e-2 if self.fp16 else 1e-5


@st.composite
def norms(draw) -> Norm:
    fp16 = draw(st.booleans())
    alpha = draw(st.sampled_from([1, 1, 1, 2]))
    eps = draw(st.sampled_from([1e-6, 1e-5, 1e-3, None, -1e-3, float("nan"), float("inf")]))
    return Norm(
        inverse=draw(st.sampled_from(["rsqrt", "pow", "recip", "div"])),
        square=draw(st.sampled_from(["mul", "pow2", "square"])),
        eps=eps if eps is not None or alpha == 1 else 1e-6,
        eps_form=draw(st.sampled_from(["literal", "tensor"])),
        eps_left=draw(st.booleans()) and alpha == 1,
        alpha=alpha,
        axis=draw(st.sampled_from(["last", "last", "ndim-1", "other"])),
        keepdim=draw(st.sampled_from([True, True, True, False])),
        squared=draw(st.sampled_from(["same", "same", "same", "shifted", "downcast"])),
        between="none" if fp16 else draw(st.sampled_from(["none", "none", "casts", "roundtrip", "relu", "bias"])),
        weight=draw(st.sampled_from(["leaf", "left", "gemma", "view", "leading_ones", "runtime", "none", "shape1"])),
        fp16=fp16,
    )


class NormModule(nn.Module):
    def __init__(self, spec: Norm, seed: int) -> None:
        super().__init__()
        self.spec = spec
        dtype = torch.float16 if spec.fp16 else torch.float32
        g = torch.Generator().manual_seed(seed)

        def p(*shape, base=0.0):
            return nn.Parameter((base + 0.1 * torch.randn(*shape, generator=g)).to(dtype))

        self.w, self.dw, self.b = p(D, base=1.0), p(D), p(D)
        self.w1, self.w3d = p(1, base=1.0), p(1, 1, D, base=1.0)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        s = self.spec
        h = x.float() if s.fp16 else x
        t = {"same": h, "shifted": h + 1.0, "downcast": h.half().float() if not s.fp16 else h.half().float()}[s.squared]
        sq = {"mul": t * t, "pow2": t.pow(2), "square": torch.square(t)}[s.square]
        dim = {"last": -1, "ndim-1": h.dim() - 1, "other": 1}[s.axis]
        v = sq.mean(dim, keepdim=s.keepdim)
        if not s.keepdim:
            v = v.unsqueeze(dim)  # still broadcasts: a correct norm spelled another way, never fused
        if s.eps is not None:
            e = torch.tensor(s.eps) if s.eps_form == "tensor" else s.eps
            if s.alpha != 1:
                v = torch.add(v, e, alpha=s.alpha)
            else:
                v = e + v if s.eps_left else v + e
        if s.inverse == "div":
            n = h / torch.sqrt(v)
        else:
            inv = {"rsqrt": torch.rsqrt, "pow": lambda a: torch.pow(a, -0.5), "recip": lambda a: 1 / torch.sqrt(a)}
            n = h * inv[s.inverse](v)
        n = {
            "none": lambda: n,
            "casts": lambda: n.double().float(),
            "roundtrip": lambda: n.half().float(),
            "relu": lambda: torch.relu(n),
            "bias": lambda: n + self.b,
        }[s.between]()
        if s.fp16:
            n = n.to(x.dtype)
        w = {
            "leaf": lambda: n * self.w,
            "left": lambda: self.w * n,
            "gemma": lambda: n * (1.0 + self.dw),
            "view": lambda: n * self.w.view(1, 1, D),
            "leading_ones": lambda: n * self.w3d,
            "runtime": lambda: n * (1 + scale),
            "none": lambda: n,
            "shape1": lambda: n * self.w1,
        }
        return w[s.weight]()


class Many(nn.Module):
    def __init__(self, specs: list[Norm]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(NormModule(s, i) for i, s in enumerate(specs))

    def forward(self, *args):
        return tuple(part(args[2 * i], args[2 * i + 1]) for i, part in enumerate(self.parts))


def _inputs(specs: list[Norm]) -> tuple:
    g = torch.Generator().manual_seed(7)
    out = []
    for s in specs:
        dtype = torch.float16 if s.fp16 else torch.float32
        out += [(2 * torch.randn(*SHAPE, generator=g)).to(dtype), (0.1 * torch.rand(1, 1, D, generator=g)).to(dtype)]
    return tuple(out)


def _owners(ep, n_outputs: int) -> dict:
    """node name -> index of the norm (output) it belongs to."""
    out = next(n for n in ep.graph_module.graph.nodes if n.op == "output")
    owner: dict[str, int] = {}
    for i, node in enumerate(out.args[0][:n_outputs]):
        stack = [node]
        while stack:
            n = stack.pop()
            if n.name not in owner:
                owner[n.name] = i
                stack.extend(n.all_input_nodes)
    return owner


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(specs=st.lists(norms(), min_size=1, max_size=4))
def test_fusion_is_exact_where_it_fuses_and_complete_on_plain_norms(specs):
    from executorch.exir import to_edge

    from edgeplug_fixture_backends import registered

    model = Many(specs).eval()
    inputs = _inputs(specs)
    with torch.no_grad():
        eager = model(*inputs)
        ep = to_edge(torch.export.export(model, inputs)).exported_program()
        unfused = ep.module()(*inputs)
    owner = _owners(ep, len(specs))
    for name, changes in POLICIES:
        with registered():
            b = edgeplug.get_backend(name)
            policy = b.fusion_policy("rms_norm").model_copy(update=changes)
            backend = f"{name} {changes}" if changes else name
            target = policy.target.replace(".", "::")
            fused_ep, records = edgeplug.fuse(ep, dataclasses.replace(b, fusion_policies=(policy,)))
        by_norm: dict[int, list] = {}
        for r in records:
            by_norm.setdefault(owner[r.anchor], []).append(r)
        with torch.no_grad():
            got = fused_ep.module()(*inputs)
        fused_owner = _owners(fused_ep, len(specs))
        for i, spec in enumerate(specs):
            recs = by_norm.get(i, [])
            fused = [r for r in recs if r.outcome in FUSED]
            ops = [n for n in fused_ep.graph_module.graph.nodes if fused_owner.get(n.name) == i and is_op(n, target)]
            where = f"{backend}: {spec}: {[(r.outcome, r.reason) for r in recs]}"
            if spec.plain:
                assert len(fused) == 1 and len(ops) == 1, f"plain norm not fused: {where}"
            else:
                assert not fused and not ops, f"perturbed norm fused: {where}"
            assert got[i].dtype == eager[i].dtype and got[i].shape == eager[i].shape, where
            if ops:
                torch.testing.assert_close(got[i], eager[i], rtol=spec.tolerance, atol=spec.tolerance, msg=where)
            else:
                torch.testing.assert_close(got[i], unfused[i], rtol=0, atol=0, equal_nan=True, msg=where)


def test_property_strategy_reaches_both_sides():
    """The strategy draws plain norms and perturbed ones (a property that can fail)."""
    from hypothesis import find

    assert find(norms(), lambda n: n.plain).plain
    assert not find(norms(), lambda n: not n.plain).plain
