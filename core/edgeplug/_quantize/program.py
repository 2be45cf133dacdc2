"""What a quantized program is, apart from how ``quantize`` makes one: what ``quantize`` returns
(``QuantizedModel``: the converted program with a ``QuantizationInfo`` of what was done, handed to
``lower`` explicitly), how to tell a quantized program (``is_quantized``), the scale of each output
(``output_steps``), and the report's account of it (``describe_quantization``).

Below the pipeline, quantization and verification: each of them imports this module, it imports
none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from edgeplug._records import FusionRecord, TransformRecord
from edgeplug._report.records import QuantizationSummary, StageTiming


@dataclass
class QuantizationInfo:
    """What ``quantize`` did: ``QuantizedModel.quantization``."""

    backend: str
    scheme: str
    description: str
    activation_bits: Optional[int]
    weight_bits: int
    per_channel: bool
    #: the distribution that contributed the scheme
    distribution: str = ""
    #: "pt2e" (prepare/calibrate/convert) or "source_transform" (torchao's quantize_ before export)
    kind: str = "pt2e"
    calibration_batches: int = 0
    #: the most calibration batches read (``quantize(calibration_batches=)``), and whether the data had more
    calibration_limit: int = 0
    calibration_cut: bool = False
    #: (stage, seconds) in the order they ran
    stages: list[tuple[str, float]] = field(default_factory=list)
    #: the RMSNorm recomposition before annotation, one record per match
    fusions: list[FusionRecord] = field(default_factory=list)
    #: constant-only subgraphs folded before annotation (and folds refused, with why)
    folds: list[TransformRecord] = field(default_factory=list)
    #: nodes dropped before annotation because they compute nothing (``drop_no_op_casts``)
    rewrites: list[TransformRecord] = field(default_factory=list)
    #: decomposed RMSNorms whose arithmetic the quantizer was told to leave float (no norm op on the backend)
    float_norms: list[str] = field(default_factory=list)
    #: layers a source transform left float, one ``"fqn (type, weight shape): why"`` each (a group size
    #: that does not divide the layer's width)
    kept_float: list[str] = field(default_factory=list)
    #: the float model's outputs on ``inputs`` (``(args, kwargs)``; for |lowered - float| in reports)
    inputs: tuple = ((), {})
    float_outputs: list[Any] = field(default_factory=list)

    def summary(self) -> "QuantizationSummary":
        return QuantizationSummary(
            quantizer_backend=self.backend, scheme=self.scheme, description=self.description,
            activation_bits=self.activation_bits, weight_bits=self.weight_bits, per_channel=self.per_channel,
            distribution=self.distribution, calibration_batches=self.calibration_batches,
            calibration_limit=self.calibration_limit, calibration_cut=self.calibration_cut,
            norms=self.fusions, folds=self.folds, kind=self.kind, kept_float=self.kept_float,
            rewrites=self.rewrites, float_norms=self.float_norms,
        )


class QuantizedModel(torch.nn.Module):
    """What ``edgeplug.quantize`` returns: the quantized program (``program``, a ``GraphModule``) and what
    was done to make it (``quantization``). Call it, export it or lower it as the model it stands for;
    ``lower`` takes ``quantization`` from here for its report and its verification."""

    def __init__(self, program: torch.fx.GraphModule, quantization: QuantizationInfo) -> None:
        super().__init__()
        self.program = program
        self.quantization = quantization

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.program(*args, **kwargs)


def _graph_module(model: Any) -> Any:
    if isinstance(model, QuantizedModel):
        return model.program
    return model.graph_module if isinstance(model, ExportedProgram) else model


def is_quantized(model: Any) -> bool:
    """Whether ``model`` (a module or program) holds quantize/dequantize ops or came from ``quantize``."""
    if isinstance(model, QuantizedModel):
        return True
    gm = _graph_module(model)
    graph = getattr(gm, "graph", None)
    if graph is None:
        return False
    return any(n.op == "call_function" and _is_quant_op(str(n.target)) for n in graph.nodes)


def _is_quant_op(target: str) -> bool:
    """PT2E's quantize/dequantize ops, and torchao's (a source transform's program after export)."""
    return "quantized_decomposed" in target or (target.startswith("torchao.") and "quantize" in target)


def output_steps(model: Any) -> list[Optional[float]]:
    """Per output of ``model``'s graph: the scale of the dequantize that produces it, or None."""
    gm = _graph_module(model)
    graph = getattr(gm, "graph", None)
    if graph is None:
        return []
    out = next((n for n in reversed(graph.nodes) if n.op == "output"), None)
    if out is None:
        return []
    steps: list[Optional[float]] = []
    for leaf in pytree.tree_leaves(out.args[0]):
        if not isinstance(leaf, torch.fx.Node):
            continue
        step = None
        if leaf.op == "call_function" and "dequantize_per_tensor" in str(leaf.target) and len(leaf.args) > 1:
            scale = leaf.args[1]
            if isinstance(scale, torch.fx.Node) and scale.op == "get_attr":
                scale = _attr(gm, scale.target)
            if isinstance(scale, torch.Tensor) and scale.numel() == 1:
                scale = scale.item()
            step = float(scale) if isinstance(scale, (int, float)) else None
        steps.append(step)
    return steps


def _attr(gm: Any, target: str) -> Any:
    value = gm
    for part in target.split("."):
        value = getattr(value, part, None)
    return value


def describe_quantization(report: Any, info: Optional[QuantizationInfo], quantized: bool, backend: Any) -> None:
    """Put what ``quantize`` did (``info``) into a lowering ``report``: scheme, norms, timings, and a note
    when the program was quantized with another backend's quantizer, or (``quantized`` with no ``info``)
    by a quantizer edgeplug did not run."""
    if info is None:
        if quantized and report.quantization is None:
            report.notes.append(
                "the program holds quantize/dequantize ops from a quantizer edgeplug did not run; "
                "its norms were not recomposed before annotation (use edgeplug.quantize or --quantize)"
            )
        return
    summary = report.quantization or info.summary()
    summary.foreign = info.backend != backend.name
    report.quantization = summary
    report.stages = [StageTiming(stage=f"quantize: {s}", seconds=t) for s, t in info.stages] + list(report.stages)
    if summary.foreign:
        report.notes.append(
            f"this program was quantized with {info.backend}'s quantizer (scheme {info.scheme!r}, "
            f"{info.distribution}), not {backend.name}'s: {backend.name} may not run it as it is; quantize "
            f"for {backend.name} (--backend {backend.name} --quantize SCHEME) to lower it"
        )
