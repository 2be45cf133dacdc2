"""Quantization through a backend's own PT2E quantizer.

``quantize(model, example_inputs, backend, scheme)`` runs, in order:

1. ``torch.export`` (skipped for an ExportedProgram);
2. the backend's export-stage passes (``edgeplug.transform``);
3. RMSNorm recomposed on the aten program under the backend's fusion policy
   (Gemma's ``1 + w`` folded into a constant), so the quantizer annotates one
   norm op instead of pow/mean/rsqrt/mul and quantize/dequantize never land
   inside a norm;
4. ``prepare_pt2e`` with the scheme's quantizer (from the backend's
   ``edgeplug_quantizers`` records), calibration, ``convert_pt2e``.

The result is the converted ``torch.fx.GraphModule``; ``quantization_info(gm)``
returns what was done (backend, scheme, timings, the recomposed norms), which
``edgeplug.lower`` puts in its report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

from edgeplug.errors import EdgeplugError, PluginConflictError
from edgeplug.records import FusionRecord, QuantScheme

Progress = Callable[[str], None]

#: key of ``GraphModule.meta`` under which ``quantize`` leaves its ``QuantizationInfo``
META_KEY = "edgeplug_quantization"


class QuantizationError(EdgeplugError):
    """Quantizing a model failed, or was asked of a backend/scheme that cannot do it."""


@dataclass
class QuantizationInfo:
    """What ``quantize`` did; ``quantization_info(gm)`` returns it."""

    backend: str
    scheme: str
    description: str
    activation_bits: Optional[int]
    weight_bits: int
    per_channel: bool
    #: the distribution that contributed the scheme
    distribution: str = ""
    calibration_batches: int = 0
    #: (stage, seconds) in the order they ran
    stages: list[tuple[str, float]] = field(default_factory=list)
    #: the RMSNorm recomposition before annotation, one record per match
    fusions: list[FusionRecord] = field(default_factory=list)


# -- schemes ---------------------------------------------------------------------


def _backend_name(backend: Any) -> str:
    return backend.name if hasattr(backend, "name") else str(backend).strip().lower()


def _contributions(backend: str) -> list[tuple[Any, QuantScheme]]:
    from edgeplug.plugins import manager

    return [(info, rec) for info, rec in manager().records("edgeplug_quantizers", backend)]


def schemes(backend: Any) -> list[QuantScheme]:
    """The quantization schemes ``backend`` (a name or ``Backend``) offers, in plugin order."""
    from edgeplug.backend import get_backend

    name = get_backend(backend).name if isinstance(backend, str) else _backend_name(backend)
    return [rec for _, rec in _contributions(name)]


def _describe(schemes_: Sequence[QuantScheme]) -> str:
    return "; ".join(f"{s.scheme} ({s.description})" for s in schemes_)


def quant_scheme(backend: Any, scheme: str) -> QuantScheme:
    """The record of ``scheme`` for ``backend``; a clear error when there is none, or two."""
    from edgeplug.backend import backends, get_backend

    b = get_backend(backend) if isinstance(backend, str) else backend
    found = _contributions(b.name)
    key = scheme.strip().lower()
    if not found:
        able = [n for n in backends() if _contributions(n)]
        others = f"backends with quantizers: {', '.join(able)}" if able else "no installed backend has one"
        raise QuantizationError(
            f"backend {b.name!r} has no quantizer: no installed plugin yields a QuantScheme for it "
            f"(hook edgeplug_quantizers); {others}. Lower the float model, or quantize for one of those"
        )
    matches = [(info, rec) for info, rec in found if rec.scheme == key]
    if len(matches) > 1:
        (a, _), (c, _) = matches[:2]
        raise PluginConflictError(
            f"two quantization schemes named {key!r} for backend {b.name!r}: from distribution "
            f"{a.distribution} (plugin {a.name!r}) and from distribution {c.distribution} (plugin {c.name!r}). "
            "Uninstall one, or disable one with EDGEPLUG_DISABLE_PLUGINS=<plugin>"
        )
    if not matches:
        import difflib

        names = [rec.scheme for _, rec in found]
        close = difflib.get_close_matches(key, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise QuantizationError(
            f"backend {b.name!r} has no quantization scheme {scheme!r}{hint}; its schemes: "
            f"{_describe([rec for _, rec in found])}"
        )
    return matches[0][1]


def make_quantizer(backend: Any, scheme: str) -> Any:
    """A fresh torchao ``Quantizer`` for ``scheme`` of ``backend`` (never reaches the network)."""
    from edgeplug.backend import get_backend

    b = get_backend(backend) if isinstance(backend, str) else backend
    rec = quant_scheme(b, scheme)
    try:
        return rec.factory()
    except Exception as exc:
        raise QuantizationError(
            f"building the quantizer of scheme {rec.scheme!r} for backend {b.name!r} failed: "
            f"{type(exc).__name__}: {exc}. The factory comes from the backend's plugin "
            f"({b.distribution}); check its executorch version"
        ) from exc


# -- the pipeline ----------------------------------------------------------------


def recompose_norms(ep: Any, backend: Any) -> tuple[Any, list[FusionRecord]]:
    """RMSNorm recomposed on an aten-dialect program under ``backend``'s fusion policy.

    ``ep`` is left as it was. A backend without an rms_norm policy gets ``ep`` back.
    """
    from edgeplug.pipeline import fuse

    return fuse(ep, backend)


def _batches(calibration: Optional[Iterable[Any]], example_inputs: tuple) -> Iterable[tuple]:
    if calibration is None:
        return [example_inputs]
    return calibration


def quantize(
    model: Any,
    example_inputs: Sequence[Any],
    backend: Any,
    scheme: str,
    calibration: Optional[Iterable[Sequence[Any]]] = None,
    *,
    progress: Optional[Progress] = None,
) -> Any:
    """Quantize ``model`` with ``backend``'s quantizer for ``scheme``; returns the converted GraphModule.

    ``calibration`` is an iterable of input tuples (a single tensor counts as a
    one-input tuple) run through the observed model; by default the example
    inputs. The caller's model is not changed.
    """
    import torch
    from torch.export import ExportedProgram
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from edgeplug.backend import get_backend
    from edgeplug.pipeline import transform

    b = get_backend(backend) if isinstance(backend, str) else backend
    rec = quant_scheme(b, scheme)  # before any work: an unknown scheme fails at once
    say = progress or (lambda msg: None)
    example_inputs = tuple(example_inputs)
    info = QuantizationInfo(
        backend=b.name, scheme=rec.scheme, description=rec.description, activation_bits=rec.activation_bits,
        weight_bits=rec.weight_bits, per_channel=rec.per_channel, distribution=b.distribution,
    )

    def timed(stage: str, fn: Callable[[], Any]) -> Any:
        say(f"[{b.name}] quantize {rec.scheme}: {stage} ...")
        t = time.perf_counter()
        try:
            value = fn()
        except EdgeplugError:
            raise
        except Exception as exc:
            raise QuantizationError(
                f"quantizing for backend {b.name!r} with scheme {rec.scheme!r} failed at {stage!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        info.stages.append((stage, time.perf_counter() - t))
        return value

    if isinstance(model, ExportedProgram):
        ep = model
    else:
        ep = timed("export", lambda: torch.export.export(model, example_inputs))
    ep = timed("export passes", lambda: transform(ep, b))
    ep, info.fusions = timed("recompose norms", lambda: recompose_norms(ep, b))
    quantizer = timed("build quantizer", lambda: make_quantizer(b, rec.scheme))
    prepared = timed("prepare", lambda: prepare_pt2e(ep.module(), quantizer))

    def calibrate() -> None:
        with torch.no_grad():
            for batch in _batches(calibration, example_inputs):
                args = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
                prepared(*args)
                info.calibration_batches += 1
        if info.calibration_batches == 0:
            raise QuantizationError("the calibration data is empty: give at least one input tuple")

    timed("calibrate", calibrate)
    converted = timed("convert", lambda: convert_pt2e(prepared))
    converted.meta[META_KEY] = info
    return converted


def quantization_info(model: Any) -> Optional[QuantizationInfo]:
    """What ``quantize`` did to ``model`` (its result), or None for any other model."""
    meta = getattr(model, "meta", None)
    return meta.get(META_KEY) if isinstance(meta, dict) else None


__all__ = [
    "QuantizationError",
    "QuantizationInfo",
    "make_quantizer",
    "quant_scheme",
    "quantization_info",
    "quantize",
    "recompose_norms",
    "schemes",
]
