"""Quantized transformers decoders on XNNPACK: edgeplug beside stock ExecuTorch, same quantizer.

For each model (a tiny, randomly initialised transformers decoder from
``edgeplug._zoo``: nothing is downloaded) and scheme, two sides from the same
float model in one process:

- **edgeplug**: ``edgeplug.quantize(model, inputs, "xnnpack", scheme)`` then
  ``edgeplug.lower(..., verify=True)`` (the .pte runs in executorch's runtime);
- **stock**: what a user of executorch alone runs for the same quantizer.
  8a8w: ``torch.export``, ``prepare_pt2e`` with ``XNNPACKQuantizer`` (symmetric,
  per channel), one calibration call, ``convert_pt2e``, export again; 8da4w:
  torchao's ``quantize_`` with ``Int8DynamicActivationIntxWeightConfig`` (int4,
  groups of 32) on a copy, ``torch.export``. Then
  ``to_edge_transform_and_lower(XnnpackPartitioner())`` and ``to_executorch()``;
  its .pte runs in executorch's runtime too.

Per side: lowers or the first line of its error, partitions, nodes left on the
CPU, cosine similarity of the .pte's logits to the float model's, max
|.pte - float|, and the .pte's size.

    python bench/quantize_decoders.py [--models llama,qwen3] [--schemes 8a8w,8da4w] [--layers 1] [--json out.json]

``--where`` instead says where 8da4w's error comes from, in torchao's own eager quantization (no
lowering, both sides share it): the logits' cosine to float with only one kind of linear quantized, with
only the head, with groups of 16, and how large the layer's addition to the residual stream is beside the
embedding it is added to (a sublayer whose output is normalised, Gemma's post-attention and
post-feed-forward norms, carries its quantization noise into the residual at full size).

    python bench/quantize_decoders.py --where --models llama,gemma3,olmo2
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import operator
import sys
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Optional

import torch

from edgeplug._zoo import build


def _quiet() -> None:
    # executorch's partitioners log every node at INFO; a handler first, so executorch's own
    # basicConfig(level=INFO) on import is a no-op (not logging.disable: edgeplug reads DEBUG records)
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.ERROR)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def stock_graph_breaks(edge_ep: Any) -> tuple[int, int]:
    """(partitions, nodes left on the CPU) of a program stock executorch lowered, counted as edgeplug's report does."""
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    partitions = len(get_lowered_submodules(edge_ep.graph_module))
    cpu = sum(
        1 for n in edge_ep.graph_module.graph.nodes
        if n.op == "call_function" and n.target is not operator.getitem and "executorch_call_delegate" not in str(n.target)
    )
    return partitions, cpu


@dataclass
class Side:
    lowers: bool = False
    error: str = ""
    partitions: int = 0
    cpu_nodes: int = 0
    cosine: Optional[float] = None
    max_abs_float: Optional[float] = None
    pte_bytes: int = 0


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def _run_pte(buffer: bytes, inputs: tuple) -> torch.Tensor:
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    return _load_for_executorch_from_buffer(buffer).forward(list(inputs))[0]


def edgeplug_side(model: torch.nn.Module, inputs: tuple, scheme: str, float_out: torch.Tensor) -> Side:
    import edgeplug

    side = Side()
    try:
        result = edgeplug.lower(edgeplug.quantize(model, inputs, "xnnpack", scheme), inputs, "xnnpack", verify=True)
    except Exception as exc:
        side.error = first_line(exc)
        return side
    report = result.report
    side.lowers = bool(report.verification and report.verification.passed)
    if not side.lowers:
        side.error = "verification failed: " + "; ".join(report.verification.failures())
    side.partitions = len(report.partitions)
    side.cpu_nodes = sum(report.cpu_ops.values())
    side.pte_bytes = len(result.buffer)
    out = _run_pte(result.buffer, inputs)
    side.cosine, side.max_abs_float = _cosine(out, float_out), (out - float_out).abs().max().item()
    return side


def _stock_program(model: torch.nn.Module, inputs: tuple, scheme: str) -> torch.export.ExportedProgram:
    if scheme == "8a8w":
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
        prepared = prepare_pt2e(torch.export.export(model, inputs).module(), quantizer)
        with torch.no_grad():
            prepared(*inputs)
        return torch.export.export(convert_pt2e(prepared), inputs)
    if scheme == "8da4w":
        from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
        from torchao.quantization.granularity import PerGroup

        copied = copy.deepcopy(model)
        with torch.no_grad():
            quantize_(copied, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)))
        return torch.export.export(copied, inputs)
    raise SystemExit(f"no stock flow for scheme {scheme!r} here (8a8w, 8da4w)")


def stock_side(model: torch.nn.Module, inputs: tuple, scheme: str, float_out: torch.Tensor) -> Side:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    side = Side()
    try:
        ep = _stock_program(model, inputs, scheme)
        edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
        side.partitions, side.cpu_nodes = stock_graph_breaks(edge.exported_program())
        buffer = edge.to_executorch().buffer
        out = _run_pte(buffer, inputs)
    except Exception as exc:
        side.error = first_line(exc)
        return side
    side.lowers, side.pte_bytes = True, len(buffer)
    side.cosine, side.max_abs_float = _cosine(out, float_out), (out - float_out).abs().max().item()
    return side


def run(models: list[str], schemes: list[str], layers: int) -> list[dict[str, Any]]:
    rows = []
    for name in models:
        model, inputs = build(name, layers=layers)
        with torch.no_grad():
            float_out = model(*inputs)
        for scheme in schemes:
            ours, stock = edgeplug_side(model, inputs, scheme, float_out), stock_side(model, inputs, scheme, float_out)
            rows.append({"model": name, "scheme": scheme, "edgeplug": asdict(ours), "stock": asdict(stock)})
            print(f"{name} {scheme}: edgeplug {_cell(ours)} | stock {_cell(stock)}", file=sys.stderr, flush=True)
    return rows


def _cell(side: Side | dict) -> str:
    s = side if isinstance(side, dict) else asdict(side)
    if not s["lowers"]:
        return f"fails: {s['error']}"
    return f"{s['partitions']} / {s['cpu_nodes']}, cosine {s['cosine']:.4f}, max {s['max_abs_float']:.3f}, {s['pte_bytes'] / 1024:.1f} KiB"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | scheme | edgeplug: partitions / CPU nodes, cosine to float, max abs diff to float, .pte | stock |",
        "| --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {r['scheme']} | {_cell(r['edgeplug'])} | {_cell(r['stock'])} |")
    return "\n".join(lines)


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def where_8da4w(name: str, layers: int) -> dict[str, float]:
    """Cosine of torchao-eager 8da4w logits to float, whole and per part, and the residual's make-up (layer 0)."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    model, inputs = build(name, layers=layers)
    with torch.no_grad():
        float_out = model(*inputs)

    def cosine(group: int = 32, only: Optional[str] = None, skip: Optional[str] = None) -> float:
        copied = copy.deepcopy(model)
        config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(group))
        keep = lambda m, fqn: isinstance(m, torch.nn.Linear) and (only is None or fqn.endswith(only)) and (skip is None or not fqn.endswith(skip))  # noqa: E731
        with torch.no_grad():
            quantize_(copied, config, filter_fn=keep)
            return _cosine(copied(*inputs), float_out)

    row = {"8da4w": cosine(), "groups of 16": cosine(group=16), "head only": cosine(only="lm_head"),
           "all but the head": cosine(skip="lm_head")}
    row.update({f"{p} only": cosine(only=p) for p in PROJECTIONS})
    layer, seen = model.model.model.layers[0], {}
    hooks = [
        layer.register_forward_pre_hook(lambda m, a, k: seen.__setitem__("in", (a[0] if a else k["hidden_states"])), with_kwargs=True),
        layer.register_forward_hook(lambda m, a, k, out: seen.__setitem__("out", out[0] if isinstance(out, tuple) else out), with_kwargs=True),
    ]
    with torch.no_grad():
        model(*inputs)
    for h in hooks:
        h.remove()
    rms = lambda t: t.double().pow(2).mean().sqrt().item()  # noqa: E731
    row["rms(embedding)"], row["rms(layer 0's addition)"] = rms(seen["in"]), rms(seen["out"] - seen["in"])
    return row


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="llama,qwen3")
    p.add_argument("--schemes", default="8a8w,8da4w")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--json", help="write the rows as JSON here")
    p.add_argument("--where", action="store_true", help="where 8da4w's error comes from (torchao eager, no lowering)")
    args = p.parse_args(argv)
    _quiet()
    if args.where:
        rows = {m: where_8da4w(m, args.layers) for m in args.models.split(",")}
        keys = list(next(iter(rows.values())))
        print("| model | " + " | ".join(keys) + " |")
        print("| --- " * (len(keys) + 1) + "|")
        for m, r in rows.items():
            print(f"| {m} | " + " | ".join(f"{r[k]:.4f}" for k in keys) + " |")
        return 0
    rows = run(args.models.split(","), args.schemes.split(","), args.layers)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
