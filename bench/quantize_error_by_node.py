"""Where a PT2E-quantized zoo decoder's error comes from, node by node (no lowering).

The float aten program ``edgeplug.quantize`` annotates (export, the backend's export passes,
no-op casts dropped, norms recomposed, constants folded) and the converted program are run on
the same input; for every node both hold, the cosine of its output to the float one and the
float output's RMS are printed, with the model line it came from. A node whose RMS is below the
activation quantizer's smallest scale loses its values when its output is quantized.

``--eps`` rebuilds XNNPACK's 8a8w quantizer (symmetric, per channel) with that floor on every
observer's scale instead of executorch's 2**-12 (``get_symmetric_quantization_config``), lowers
the program and runs its .pte in executorch's runtime: the logits' cosine to float says how much
of the error the floor accounts for.

    python bench/quantize_error_by_node.py --model olmo2 [--backend xnnpack --scheme 8a8w] [--layers 1]
    python bench/quantize_error_by_node.py --model olmo2 --eps 1e-7
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Optional

import torch


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


def _outputs(gm: torch.fx.GraphModule, args: tuple) -> dict[str, Any]:
    values: dict[str, Any] = {}

    class _Keep(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            values[n.name] = out = super().run_node(n)
            return out

    with torch.no_grad():
        _Keep(gm).run(*args)
    return values


def by_node(model: str, backend: str, scheme: str, layers: int) -> None:
    import edgeplug
    from edgeplug._registry.lookup import get_backend
    from edgeplug._quantize.quantize import drop_no_op_casts, fold_before_annotation, recompose_norms
    from edgeplug._graph.export_stage import run_export_stage
    from edgeplug._zoo._models import build

    m, args = build(model, layers)
    quantized = edgeplug.quantize(m, args, backend, scheme)
    b = get_backend(backend)
    ep = run_export_stage(torch.export.export(m, args), b)
    ep, _ = drop_no_op_casts(ep)
    ep, _ = recompose_norms(ep, b)
    ep, _ = fold_before_annotation(ep, b)
    float_gm = ep.module()
    want, got = _outputs(float_gm, args), _outputs(quantized.program, args)
    for n in float_gm.graph.nodes:
        x, y = want.get(n.name), got.get(n.name)
        if n.op != "call_function" or not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            continue
        if not x.is_floating_point() or x.shape != y.shape or x.numel() < 2:
            continue
        trace = [t.strip() for t in (n.meta.get("stack_trace") or "").splitlines() if t.strip()]
        print(f"{n.name:34s} {str(tuple(x.shape)):16s} cos {_cosine(x, y):.4f}  rms {x.pow(2).mean().sqrt().item():.3g}"
              f"  {trace[-1][:80] if trace else ''}")


def with_eps(model: str, eps: float, layers: int) -> None:
    import edgeplug
    import edgeplug._quantize.quantize as quantization
    from edgeplug._zoo._models import build

    def quantizer() -> Any:
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )

        config = get_symmetric_quantization_config(is_per_channel=True)

        def floor(spec: Optional[Any]) -> Optional[Any]:
            if spec is None:
                return None
            ctr = spec.observer_or_fake_quant_ctr
            return dataclasses.replace(spec, observer_or_fake_quant_ctr=ctr.p.func.with_args(**{**ctr.p.keywords, "eps": eps}))

        fields = (floor(config.input_activation), floor(config.output_activation), floor(config.weight))
        return XNNPACKQuantizer().set_global(type(config)(*fields, config.bias, config.is_qat))

    quantization.make_quantizer = lambda backend, scheme: quantizer()  # this process only
    m, args = build(model, layers)
    result = edgeplug.lower(edgeplug.quantize(m, args, "xnnpack", "8a8w"), args, "xnnpack")
    verification = edgeplug.verify(result, "xnnpack")
    q = result.report.quantization
    print(f"{model} xnnpack 8a8w, scale floor {eps:g}: .pte verifies {verification.passed} ({verification.method}), "
          f"cosine to float {q.cosine_to_float[0]:.4f}, max |q - float| {q.versus_float[0]:.3g}")


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a built-in zoo model (llama, gemma3, olmo2, ...)")
    p.add_argument("--backend", default="xnnpack")
    p.add_argument("--scheme", default="8a8w", help="a PT2E scheme of the backend")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--eps", type=float, help="XNNPACK 8a8w only: lower with this floor on the scales instead")
    a = p.parse_args(argv)
    if a.eps is not None:
        with_eps(a.model, a.eps, a.layers)
    else:
        by_node(a.model, a.backend, a.scheme, a.layers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
