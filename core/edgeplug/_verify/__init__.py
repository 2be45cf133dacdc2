"""Verification, in one package: run a lowered program here, compare it with eager, explain the result.

- ``verify``: ``verify_lowering(result, backend)``, what ``edgeplug.verify`` runs; it chooses, once, the float or the
  quantized path and the runner (``BackendSpec.verify_method``);
- ``where``: where a backend's programs run here, and why not (light: `edgeplug backends` reads it);
- ``targets``: what runs the program: the ``.pte`` in executorch's runtime (or the backend's device
  runtime), or the delegates on host kernels;
- ``host``: the host-kernel interpreter of a lowered program (``run_lowered``, ``OpCall``);
- ``steps``: decode steps for a program that keeps state in buffers (a KV cache);
- ``quantized``: a quantized program against the quantized model, in steps of its output scale;
- ``compare``: one output against its reference, in a way a NaN cannot fool; default tolerances.

The eager reference itself is ``edgeplug._eager`` (``lower`` and ``quantize`` take one too).
"""

from __future__ import annotations

from typing import Optional

from edgeplug._lazy import lazy_names

# name -> (module, attribute): imported on first use, so a light submodule (``where``) loads without executorch
_LAZY: dict[str, tuple[str, Optional[str]]] = {
    "check_tolerance": ("edgeplug._verify.compare", "check_tolerance"),
    "compare_output": ("edgeplug._verify.compare", "compare_output"),
    "compare_outputs": ("edgeplug._verify.compare", "compare_outputs"),
    "refuse_verify_without_runtime": ("edgeplug._verify.verify", "refuse_verify_without_runtime"),
    "verify_lowering": ("edgeplug._verify.verify", "verify_lowering"),
}

__getattr__, __dir__ = lazy_names(__name__, _LAZY)

__all__ = sorted(_LAZY)
