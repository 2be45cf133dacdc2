"""Programs the conformance suite and backends' tests lower besides the built-in examples (the model
registry, ``edgeplug._models``, lists them as ``testing-cached-attention`` and
``testing-mobilenet-v2-blocks`` / ``testing-mobilenet-v3-blocks``).

``cached_attention``: one attention block over a static KV cache, written the
way ExecuTorch's LLM export writes it: the cache is updated in place with
``llama::update_cache`` at a data-dependent position (``input_pos[0].item()``),
and attention is ``llama::custom_sdpa`` (both registered by
``executorch.extension.llm.custom_ops``). The sequence length is dynamic, so
the exported program carries unbacked symbols, as a deployed decoder does.
``CUSTOM_OPS`` names the custom ops it calls, as reports name them.

``mobilenet_blocks``: a tiny MobileNet v2 or v3 made of torchvision's building
blocks (torchvision does not import beside CPU torch 2.13.0): convolution +
batch norm + relu6, inverted residuals with depthwise convolutions, and v3's
hardswish and squeeze-excitation, with batch-norm statistics far from the
identity so a fold that is skipped or wrong shows in the numbers.

torch loads when this module is imported; executorch only when a program needs it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CUSTOM_OPS", "cached_attention", "mobilenet_blocks"]

#: the custom ops the program calls, as reports name them (the in-place update through functionalization)
CUSTOM_OPS = ("llama.custom_sdpa.default", "auto_functionalized_v2(llama.update_cache.default)")

_CACHE: dict[str, Any] = {}


def cached_attention(dim: int = 32, heads: int = 2, cache: int = 16) -> tuple[Any, tuple]:
    """``(ExportedProgram, example args)`` of the cached attention block, exported once per process.

    Callers lower the program as it is (a lowering never changes it) and must not mutate it.
    """
    key = f"{dim}x{heads}x{cache}"
    if key not in _CACHE:
        _CACHE[key] = _cached_attention_program(dim, heads, cache)
    return _CACHE[key]


def _cached_attention_program(dim: int, heads: int, cache: int) -> tuple[Any, tuple]:
    # registers llama::* by loading executorch's custom-ops library: only the cached-attention program needs it
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401

    class CachedAttention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
            self.out = torch.nn.Linear(dim, dim, bias=False)
            self.register_buffer("k_cache", torch.zeros(1, cache, heads, dim // heads))
            self.register_buffer("v_cache", torch.zeros(1, cache, heads, dim // heads))

        def forward(self, x: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, heads, dim // heads).unbind(2)
            start = input_pos[0].item()
            torch.ops.llama.update_cache(k, self.k_cache, start)
            torch.ops.llama.update_cache(v, self.v_cache, start)
            y = torch.ops.llama.custom_sdpa(q, self.k_cache, self.v_cache, start, None, 0.0, True)
            return x + self.out(y.reshape(b, t, dim))

    torch.manual_seed(0)
    model = CachedAttention().eval()
    args = (torch.randn(1, 4, dim), torch.arange(4))
    seq = torch.export.Dim("seq", min=1, max=cache - 1)
    with torch.no_grad():
        ep = torch.export.export(model, args, dynamic_shapes=({1: seq}, {0: seq}), strict=False)
    return ep, args


# -- executorch's own Llama transformer (executorch.examples.models.llama), tiny and random ----------------

#: the tiny ModelArgs every variant shares (2 layers, dim 64, 4 heads of 16, 2 kv heads)
_ET_LLAMA_ARGS = dict(
    dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, vocab_size=128, hidden_dim=128,
    max_seq_len=32, max_context_len=32, max_batch_size=1,
)


def _executorch_llama(**overrides: Any) -> tuple[nn.Module, tuple]:
    """``(model in eval mode, inputs)``: executorch's ``construct_transformer`` of the tiny ModelArgs with
    ``overrides`` (edgeplug._models's ``executorch-*`` entries say which), RMSNorm weights moved off their
    ones so a dropped weight shows; 8 token ids, or with ``use_kv_cache`` one decode step at position 0
    (a dict of inputs, as executorch's llama runner passes them)."""
    # executorch's examples package: only these models load it
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    torch.manual_seed(0)
    model = construct_transformer(ModelArgs(**_ET_LLAMA_ARGS, **overrides)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if "Norm" in type(m).__name__ and isinstance(getattr(m, "weight", None), torch.nn.Parameter):
                m.weight.add_(0.2 * torch.randn(m.weight.shape, generator=g))
    vocab = _ET_LLAMA_ARGS["vocab_size"]
    if overrides.get("use_kv_cache"):
        return model, (torch.randint(0, vocab, (1, 1), generator=g), {"input_pos": torch.tensor([0])})
    return model, (torch.randint(0, vocab, (1, 8), generator=g),)


# -- MobileNet's building blocks (after torchvision's MobileNetV2/V3, written small) ---------------------


class _ConvNormActivation(nn.Sequential):
    """Convolution without bias, batch norm, then the activation (none for v2's linear bottleneck)."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1, activation: Any = nn.ReLU6):
        layers = [
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
        ]
        if activation is not None:
            layers.append(activation())
        super().__init__(*layers)


class _SqueezeExcitation(nn.Module):
    """MobileNetV3's channel gate: global average, 1x1 squeeze, relu, 1x1 excite, hardsigmoid, scale."""

    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(channels, squeezed, 1)
        self.excite = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.excite(F.relu(self.squeeze(gate))))


class _InvertedResidual(nn.Module):
    """Expand (1x1), depthwise (k x k, one group per channel), optional SE, linear projection (1x1).

    The input is added back when stride and width are kept, as in both MobileNets.
    """

    def __init__(self, cin: int, cout: int, stride: int, expand: int, kernel: int = 3, activation: Any = nn.ReLU6, se: bool = False):
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = [_ConvNormActivation(cin, hidden, 1, activation=activation)] if expand != 1 else []
        layers.append(_ConvNormActivation(hidden, hidden, kernel, stride, groups=hidden, activation=activation))
        if se:
            layers.append(_SqueezeExcitation(hidden, max(8, hidden // 4)))
        layers.append(_ConvNormActivation(hidden, cout, 1, activation=None))
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.residual else y


def mobilenet_blocks(version: str) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """``(model in eval mode, (input,))``: a tiny MobileNet ``"v2"`` or ``"v3"`` (stem, inverted residuals,
    head; 10 batch norms each), random weights, the same on every call; a 1x3x32x32 float32 input.

    v2: relu6 everywhere, expansion 1 then 6, one block with a residual. v3: hardswish, 5x5 depthwise
    convolutions, squeeze-excitation, hardswish in the classifier.
    """
    if version not in ("v2", "v3"):
        raise ValueError(f"mobilenet_blocks: version must be 'v2' or 'v3', not {version!r}")
    torch.manual_seed(0)
    if version == "v2":
        features = [
            _ConvNormActivation(3, 16, 3, 2),
            _InvertedResidual(16, 8, 1, 1),
            _InvertedResidual(8, 16, 2, 6),
            _InvertedResidual(16, 16, 1, 6),
            _ConvNormActivation(16, 64, 1),
        ]
        head = [nn.Dropout(0.2), nn.Linear(64, 10)]
    else:
        hs = nn.Hardswish
        features = [
            _ConvNormActivation(3, 16, 3, 2, activation=hs),
            _InvertedResidual(16, 16, 2, 1, activation=nn.ReLU, se=True),
            _InvertedResidual(16, 24, 1, 4, kernel=5, activation=hs, se=True),
            _InvertedResidual(24, 24, 1, 3, kernel=5, activation=hs, se=True),
            _ConvNormActivation(24, 96, 1, activation=hs),
        ]
        head = [nn.Linear(96, 64), hs(), nn.Dropout(0.2), nn.Linear(64, 10)]
    model = nn.Sequential(*features, nn.AdaptiveAvgPool2d(1), nn.Flatten(1), *head)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # statistics far from the identity: an unfolded or wrongly folded norm shows
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5, generator=g)
                m.bias.uniform_(-0.2, 0.2, generator=g)
                m.running_mean.uniform_(-0.3, 0.3, generator=g)
                m.running_var.uniform_(0.5, 2.0, generator=g)
    return model.eval(), (torch.randn(1, 3, 32, 32, generator=g),)
