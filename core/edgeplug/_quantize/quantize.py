"""Quantization through a backend's own PT2E quantizer.

``quantize(model, args, backend, scheme, kwargs=...)`` runs, in order:

1. ``torch.export`` (skipped for an ExportedProgram);
2. the backend's export-stage passes (``edgeplug.transform``);
3. RMSNorm recomposed on the aten program under the backend's fusion policy
   (Gemma's ``1 + w`` folded into a constant), after export's metadata asserts
   and casts to the dtype a tensor has are dropped (``drop_no_op_casts``: they
   hide a norm's weight, and a slice's producer from the quantizer), so the quantizer annotates one
   norm op instead of pow/mean/rsqrt/mul and quantize/dequantize never land
   inside a norm;
4. ``prepare_pt2e`` with the scheme's quantizer (from the backend's
   ``edgeplug_quantizers`` records), calibration, ``convert_pt2e``.

A ``source_transform`` scheme (torchao's ``quantize_`` with the config the
scheme's factory returns: 8da4w, int4 weight-only) instead transforms a deep
copy of the model, then exports it and runs the export-stage passes; there is
no calibration. Either way the lowering verifies against the quantized model.

The result is a ``QuantizedModel``: the converted ``torch.fx.GraphModule``
(``program``) and what was done (``quantization``: backend, scheme, timings,
the recomposed norms), which ``edgeplug.lower`` reads from it for its report
and its verification.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import linecache
import re as _re
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence

from edgeplug._backend import Backend, given_backend
from edgeplug._errors import EdgeplugError, QuantizationError
from edgeplug._records import FusionRecord, QuantScheme, TransformRecord
from edgeplug.examples import import_user_file

if TYPE_CHECKING:  # the module stays light (the CLI imports it): torch loads with quantize's first call
    from edgeplug._quantize.program import QuantizedModel

Progress = Callable[[str], None]


# -- schemes ---------------------------------------------------------------------


def schemes(backend: Backend) -> list[QuantScheme]:
    """The quantization schemes ``backend`` offers, in plugin order: its own ``QuantScheme`` records, from
    whichever registry it was resolved against."""
    return list(given_backend(backend, "schemes").records(QuantScheme))


def no_quantizer(backend: Backend, others: Sequence[str] = ()) -> QuantizationError:
    """The error for a backend without a ``QuantScheme``; ``others``: backends that have one, where the
    caller knows them (the façade does, from the registry it resolved the name against)."""
    where = f"backends with quantizers: {', '.join(others)}" if others else "`edgeplug plugins` lists each backend's schemes"
    return QuantizationError(
        f"backend {backend.name!r} has no quantizer: none of its plugins yields a QuantScheme for it "
        f"(hook edgeplug_quantizers); {where}. Lower the float model, or quantize for a backend that has one"
    )


def quant_scheme(backend: Backend, scheme: str) -> QuantScheme:
    """The record of ``scheme`` for ``backend``; a clear error naming the backend's schemes when there is none."""
    b = given_backend(backend, "quant_scheme")
    found = schemes(b)
    key = scheme.strip().lower()
    if not found:
        raise no_quantizer(b)
    # two records of one scheme name make the plugin manager refuse the backend (get_backend raised before)
    matches = [rec for rec in found if rec.scheme == key]
    if not matches:
        names = [rec.scheme for rec in found]
        close = difflib.get_close_matches(key, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise QuantizationError(
            f"backend {b.name!r} has no quantization scheme {scheme!r}{hint}; its schemes: "
            f"{', '.join(names)} (`edgeplug plugins` describes each)"
        )
    return matches[0]


def make_quantizer(backend: Backend, scheme: str) -> Any:
    """A fresh torchao ``Quantizer`` for ``scheme`` of ``backend`` (never reaches the network)."""
    b = given_backend(backend, "make_quantizer")
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

    The policy-level fuser (``edgeplug._fusion.program.fuse_program``) runs on the aten
    program: each norm becomes the policy's op, Gemma's ``1 + w`` folded into a
    constant, so the quantizer annotates one op per norm. ``ep`` is left as it
    was; a backend without an rms_norm policy gets ``ep`` back.
    """
    # torch: loaded when quantizing; the CLI's startup imports this module
    from edgeplug._fusion.program import fuse_program

    return fuse_program(ep, backend.fusion_policy("rms_norm"))


def drop_no_op_casts(ep: Any) -> tuple[Any, list[TransformRecord]]:
    """``ep`` less the nodes that compute nothing, on a copy (``ep`` itself when it has none), with a
    record of each: export's ``aten._assert_tensor_metadata`` checks, and ``.to`` / ``type_as`` /
    ``_to_copy`` to the dtype and device their input already has (``to_edge`` drops both).

    Before annotation they are in the way. The assert after ``weight * x.to(dtype)`` is a second user
    of the normalised tensor, so the norm was recomposed without its weight, ``rms_norm(x, shape,
    None, eps)``, and samsung's ENN annotator (which reads argument 2 as the weight) failed at
    prepare. A quantizer that shares a producer's quantization with a slice or view (XNNPACK's
    ``propagate_annotation``) stops at a cast: behind Gemma's ``type_as`` the rotary halves of q and k
    were left unannotated, and XNNPACK's partitioner took ``dequantize -> slice`` into the delegate
    with a float output, which XNNPACK refuses at load ("Failed to create static slice node").
    """
    # torch: loaded when quantizing; the CLI's startup imports this module
    import torch

    from edgeplug._graph.names import copy_graph

    def no_op(node: Any) -> bool:
        if node.op != "call_function":
            return False
        if node.target is torch.ops.aten._assert_tensor_metadata.default:
            return not node.users
        if node.target not in _CASTS or not node.args or not isinstance(node.args[0], torch.fx.Node):
            return False
        a, b = node.args[0].meta.get("val"), node.meta.get("val")
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        fmt = node.kwargs.get("memory_format")
        return (
            (a.dtype, a.device, a.layout, tuple(a.shape)) == (b.dtype, b.device, b.layout, tuple(b.shape))
            and node.kwargs.get("copy") is not True and fmt in (None, torch.preserve_format)
            and not any(u.op == "output" for u in node.users)
        )

    _CASTS = {
        torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout, torch.ops.aten.to.device,
        torch.ops.aten.type_as.default, torch.ops.aten._to_copy.default,
    }
    if not any(no_op(n) for n in ep.graph.nodes):
        return ep, []
    out = copy_graph(ep)
    graph, records = out.graph_module.graph, []
    for node in [n for n in graph.nodes if no_op(n)]:
        check = node.target is torch.ops.aten._assert_tensor_metadata.default
        what = "a metadata check" if check else f"a cast of {node.args[0].name} to the dtype it has"
        if node.users:
            node.replace_all_uses_with(node.args[0])
        records.append(TransformRecord(
            transform="drop_no_op_casts", kind="rewrite", node=node.name, op=str(node.target).removeprefix("aten."),
            added=0, detail=f"{what}: computes nothing",
        ))
        graph.erase_node(node)
    out.graph_module.recompile()
    return out, records


#: calibration batches read unless the caller says otherwise (``--calibration-batches``)
DEFAULT_CALIBRATION_BATCHES = 100


def quantize_for_backend(
    model: Any,
    args: Any = (),
    backend: Optional[Backend] = None,
    scheme: Optional[str] = None,
    calibration: Optional[Iterable[Sequence[Any]]] = None,
    *,
    kwargs: Optional[dict[str, Any]] = None,
    dynamic_shapes: Any = None,
    progress: Optional[Progress] = None,
    calibration_batches: int = DEFAULT_CALIBRATION_BATCHES,
) -> QuantizedModel:
    """Quantize ``model`` with ``backend``'s quantizer for ``scheme``; returns a ``QuantizedModel``.

    ``args`` and ``kwargs`` are the example inputs as ``edgeplug.lower`` takes
    them (``edgeplug._inputs``); ``dynamic_shapes`` is passed to ``torch.export``
    for a module. ``calibration`` is an iterable of positional input tuples (a
    single tensor counts as a one-input tuple) run through the observed model;
    by default the example inputs. At most ``calibration_batches`` batches are read (a
    generator that never ends is cut there); the report counts them and says
    when the data had more. The caller's model is not changed.
    """
    # torch, torchao: loaded when quantizing; the CLI's startup imports this module
    import torch
    from torch.export import ExportedProgram

    from edgeplug._inputs import inputs_for
    from edgeplug._quantize.program import QuantizedModel

    if backend is None or scheme is None:
        raise EdgeplugError(
            "edgeplug.quantize needs a backend and a scheme: quantize(model, args, BACKEND, SCHEME) "
            "(edgeplug.backends() lists the backends; `edgeplug plugins` lists each backend's schemes)"
        )
    given = inputs_for(model, args, kwargs, dynamic_shapes, where="edgeplug.quantize")
    limit = check_calibration_batches(calibration_batches)
    _refuse_second_quantization(model)
    b = given_backend(backend, "edgeplug._quantize.quantize.quantize_for_backend")
    rec = quant_scheme(b, scheme)  # before any work: an unknown scheme fails at once
    info = _info(b, rec, limit)
    timed = _QuantizeStages(b.name, rec.scheme, info, progress)
    if rec.kind == "source_transform":
        _check_source_transform(model, rec, b, calibration)
        ep = _source_transform(model, given, b, rec, timed, dynamic_shapes, info)
        info.inputs, info.float_outputs = (given.args, given.kwargs), _float_outputs(model, given)
        return QuantizedModel(ep.module(), info)
    if isinstance(model, ExportedProgram):
        ep = model
    else:
        ep = timed("export", lambda: torch.export.export(model, given.args, given.kwargs, dynamic_shapes=dynamic_shapes))
    converted = _pt2e(ep, b, rec, timed, info, lambda prepared: _calibrate(prepared, calibration, given, info))
    info.inputs, info.float_outputs = (given.args, given.kwargs), _float_outputs(model, given)
    return QuantizedModel(converted, info)


def _info(b: Any, rec: QuantScheme, limit: int) -> Any:
    """What the report will say of this quantization, filled in as the steps run."""
    from edgeplug._quantize.program import QuantizationInfo  # torch: loaded when quantizing, as above

    return QuantizationInfo(
        backend=b.name, scheme=rec.scheme, description=rec.description, activation_bits=rec.activation_bits,
        weight_bits=rec.weight_bits, per_channel=rec.per_channel, distribution=b.distribution,
        calibration_limit=limit, kind=rec.kind,
    )


def _pt2e(ep: Any, b: Any, rec: QuantScheme, timed: Any, info: Any, calibrate: Callable[[Any], Any]) -> Any:
    """The PT2E steps on an exported program: the export stage, norms recomposed, constants folded,
    the backend's quantizer built, ``prepare_pt2e``, calibration, ``convert_pt2e``; each timed."""
    # torchao: loaded when quantizing; the CLI's startup imports this module
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from edgeplug._graph.export_stage import run_export_stage

    ep = timed("export passes", lambda: run_export_stage(ep, b))
    ep, info.rewrites, info.fusions = timed("recompose norms", lambda: _recompose(ep, b))
    ep, info.folds = timed("fold constants", lambda: fold_before_annotation(ep, b))
    quantizer = timed("build quantizer", lambda: make_quantizer(b, rec.scheme))
    if b.fusion_policy("rms_norm") is None:  # the backend runs a norm's arithmetic as it is: in float
        quantizer, info.float_norms = _norm_math_in_float(ep, quantizer)
    prepared = timed("prepare", lambda: prepare_pt2e(ep.module(), quantizer))
    timed("calibrate", lambda: calibrate(prepared))
    return timed("convert", lambda: convert_pt2e(prepared))


def _norm_math_in_float(ep: Any, quantizer: Any) -> tuple[Any, list[str]]:
    """``quantizer`` made to leave each decomposed RMSNorm's arithmetic unannotated, and the norms' names.

    For a backend without a norm op (no rms_norm fusion policy) the norm stays ``pow``, ``mean``,
    ``add``, ``rsqrt`` and ``mul``, and a quantizer that annotates every ``add``/``mul`` (XNNPACK's)
    rounds ``variance + eps`` and ``x * rsqrt(...)`` to 8 bits: a variance below its smallest scale
    becomes 0 and ``rsqrt`` infinite (Gemma3's post-norms: logits' cosine to float 0.985 instead of
    0.999). Those nodes are marked annotated with nothing to observe, so they compute in float
    between the quantized input and the weight multiply, which the quantizer still annotates.
    """
    # torch, torchao: loaded when quantizing; the CLI's startup imports this module
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, Quantizer

    from edgeplug._fusion.rms_norm import RmsNormMatch, find_rms_norms

    names, norms = set(), []
    for m in find_rms_norms(ep):  # fusion's own match phase
        if not isinstance(m, RmsNormMatch) or m.spelling == "rms_norm":
            continue
        keep = {n.name for n in m.nodes} - {m.input.name} - ({m.weight_mul.name} if m.weight_mul is not None else set())
        names |= keep
        norms.append(f"{m.anchor.name} ({len(keep)} nodes)")
    if not names:
        return quantizer, []

    class _NormsInFloat(Quantizer):
        def transform_for_annotation(self, model: Any) -> Any:
            return quantizer.transform_for_annotation(model)

        def annotate(self, model: Any) -> Any:
            for n in model.graph.nodes:
                if n.name in names and n.op == "call_function":
                    n.meta["quantization_annotation"] = QuantizationAnnotation(_annotated=True)
            return quantizer.annotate(model)

        def validate(self, model: Any) -> None:
            quantizer.validate(model)

    return _NormsInFloat(), norms


def _recompose(ep: Any, backend: Any) -> tuple[Any, list[TransformRecord], list[FusionRecord]]:
    """No-op casts dropped (``drop_no_op_casts``), then norms recomposed (``recompose_norms``): one stage."""
    ep, dropped = drop_no_op_casts(ep)
    ep, fusions = recompose_norms(ep, backend)
    return ep, dropped, fusions


def _check_source_transform(model: Any, rec: QuantScheme, backend: Any, calibration: Any) -> None:
    """Before any work: a source transform needs the module itself and takes no calibration data."""
    # torch: loaded when quantizing; the CLI's startup imports this module
    from torch.export import ExportedProgram

    if isinstance(model, ExportedProgram):
        raise QuantizationError(
            f"scheme {rec.scheme!r} of backend {backend.name!r} is a torchao source transform: it rewrites the "
            "model's linear layers before export, so it needs the nn.Module, not an ExportedProgram. Pass the "
            "module (edgeplug.quantize(model, inputs, ...)), or pick a PT2E scheme of the backend"
        )
    if calibration is not None:
        raise QuantizationError(
            f"scheme {rec.scheme!r} of backend {backend.name!r} takes no calibration data (a torchao source "
            "transform: its weights are quantized from their own values and any activations per call); "
            "leave the calibration out"
        )


def _source_transform(
    model: Any, given: Any, backend: Any, rec: QuantScheme, timed: Any, dynamic_shapes: Any, info: Any
) -> Any:
    """The exported program of a deep copy of ``model`` quantized with torchao's ``quantize_`` and the
    scheme's config; the backend's export passes applied. ``model`` is left as it was. A layer whose
    width the scheme's group size does not divide stays float, named in ``info.kept_float``."""
    # torch, torchao: loaded when quantizing; the CLI's startup imports this module
    import torch
    from torchao.quantization import quantize_

    from edgeplug._graph.export_stage import run_export_stage

    steps = timed("build config", lambda: _transform_steps(make_quantizer(backend, rec.scheme), rec, backend))

    def apply() -> Any:
        with torch.no_grad():
            copied = copy.deepcopy(model)
            for config, filter_fn in steps:
                quantize_(copied, config, filter_fn=_whole_groups(config, filter_fn, kept_float))
        return copied

    kept_float: list[str] = []

    copied = timed("transform", apply)
    info.kept_float = kept_float
    ep = timed("export", lambda: torch.export.export(copied, given.args, given.kwargs, dynamic_shapes=dynamic_shapes))
    info.rewrites = [*info.rewrites, *_drop_padding_idx_of_dequantized_embeddings(ep)]
    return timed("export passes", lambda: run_export_stage(ep, backend))


def _drop_padding_idx_of_dequantized_embeddings(ep: Any) -> list[TransformRecord]:
    """``embedding(dequantize_affine(...), ids, padding_idx)`` as ``embedding(dequantize_affine(...), ids)``.

    ``padding_idx`` only stops a gradient; the forward is the same without it. Executorch's fusion of a
    dequantized table and its embedding into ``quantized_decomposed.embedding_byte`` / ``_4bit`` matches
    the two-argument form only, so with a padding index (Gemma, Phi-3 and OLMo2 declare one) the
    dequantize was left on the CPU, where no kernel runs it ("Missing out variants").
    """
    # torch: loaded when quantizing; the CLI's startup imports this module
    import torch

    from edgeplug._graph.ops import op_name

    records = []
    for node in ep.graph.nodes:
        if op_name(node) != "aten.embedding.default" or len(node.args) < 3:
            continue
        table = node.args[0]
        if not (isinstance(table, torch.fx.Node) and "dequantize_affine" in op_name(table)):
            continue
        padding = node.args[2]
        node.args = node.args[:2]
        records.append(TransformRecord(
            transform="drop_embedding_padding_idx", kind="rewrite", node=node.name, op="aten.embedding.default",
            removed=0, added=0,
            detail=f"padding_idx={padding} dropped (it only stops a gradient) so the dequantized table fuses into executorch's quantized embedding",
        ))
    if records:
        ep.graph_module.recompile()
    return records


def _group_size(config: Any) -> Optional[int]:
    """The weight group size of a torchao config (``PerGroup`` granularity, or ``group_size``); None if ungrouped."""
    for attr in ("weight_granularity", "granularity"):
        size = getattr(getattr(config, attr, None), "group_size", None)
        if isinstance(size, int):
            return size
    size = getattr(config, "group_size", None)
    return size if isinstance(size, int) else None


def _whole_groups(config: Any, filter_fn: Any, kept_float: list[str]) -> Any:
    """``filter_fn`` (None: torchao's linear layers) less the modules whose weight's last dimension
    ``config``'s group size does not divide: torchao refuses them (an assertion), so they stay float and
    each is named in ``kept_float`` (``"fqn: why"``; the report's quantization section lists them)."""
    group = _group_size(config)
    if group is None:
        return filter_fn
    # torch, torchao: loaded when quantizing; the CLI's startup imports this module
    from torchao.quantization.quant_api import _is_linear

    chosen = filter_fn or _is_linear

    def whole(module: Any, fqn: str) -> bool:
        if not chosen(module, fqn):
            return False
        weight = getattr(module, "weight", None)
        width = weight.shape[-1] if getattr(weight, "ndim", 0) >= 1 else None
        if width is not None and width % group:
            kept_float.append(
                f"{fqn or type(module).__name__} ({type(module).__name__}, weight {tuple(weight.shape)}): "
                f"its width {width} is not a multiple of the group size {group}; kept float"
            )
            return False
        return True

    return whole


def _transform_steps(made: Any, rec: QuantScheme, backend: Any) -> list[tuple[Any, Any]]:
    """A source-transform factory's answer as ``[(config, filter_fn), ...]``: one config (linear layers), or pairs."""
    if not isinstance(made, (list, tuple)):
        return [(made, None)]
    steps = [tuple(p) if isinstance(p, (list, tuple)) else p for p in made]
    if not steps or not all(isinstance(p, tuple) and len(p) == 2 and (p[1] is None or callable(p[1])) for p in steps):
        raise QuantizationError(
            f"the factory of scheme {rec.scheme!r} for backend {backend.name!r} ({backend.distribution}) returned "
            f"{made!r}: a source-transform factory returns one torchao config, or a non-empty sequence of "
            "(config, filter_fn) pairs with filter_fn(module, fqn) -> bool or None"
        )
    return steps


def fold_before_annotation(ep: Any, backend: Any) -> tuple[Any, list[TransformRecord]]:
    """``ep`` with its constant-only subgraphs folded (``edgeplug._graph.fold``), under ``backend``'s
    fold budget, so the quantizer neither observes them nor breaks them.

    A mask built from ``arange``/``cumsum``/``index`` at static shapes (transformers' decoders) is
    what the lowering would fold anyway; left in, ``prepare_pt2e`` puts observers in its index
    chain and calibration fails ("tensors used as indices must be long ..."). ``ep`` is left as it
    was; every fold (and every refusal, with why) is a record in the quantization report.
    """
    # torch: loaded when quantizing; the CLI's startup imports this module
    from edgeplug._graph.names import copy_graph
    from edgeplug._graph.fold import fold_constant_subgraphs

    out = copy_graph(ep)
    records = fold_constant_subgraphs(out, budget=backend.spec.constant_fold_budget)
    if not any(r.outcome == "applied" for r in records):
        return ep, records
    out.graph_module.recompile()
    return out, records


def _refuse_second_quantization(model: Any) -> None:
    """A model ``quantize`` made, or one holding quantize/dequantize ops, is not quantized again."""
    # torch: loaded when quantizing; the CLI's startup imports this module
    from edgeplug._quantize.program import QuantizedModel, is_quantized

    if not is_quantized(model):
        return
    done = model.quantization if isinstance(model, QuantizedModel) else None
    by = f"by {done.backend}'s quantizer, scheme {done.scheme!r}" if done is not None else "it holds quantize/dequantize ops"
    raise QuantizationError(
        f"the model is already quantized ({by}): quantizing it again would observe and round its "
        "dequantized weights a second time. Quantize the float model once, or lower this one as it is"
    )


class _QuantizeStages:
    """Runs one quantize stage: says it, times it into ``info.stages``, names it when it fails."""

    def __init__(self, backend: str, scheme: str, info: Any, progress: Optional[Progress]) -> None:
        self.backend, self.scheme, self.info = backend, scheme, info
        self.say = progress or (lambda msg: None)

    def __call__(self, stage: str, fn: Callable[[], Any]) -> Any:
        self.say(f"[{self.backend}] quantize {self.scheme}: {stage} ...")
        t = time.perf_counter()
        try:
            value = fn()
        except EdgeplugError:
            raise
        except Exception as exc:
            where = _graph_node_that_raised(exc)
            raise QuantizationError(
                f"quantizing for backend {self.backend!r} with scheme {self.scheme!r} failed at {stage!r}"
                f"{where}: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                + (
                    ". The observed program could not run there: a subgraph the quantizer annotated "
                    "computes something it must not observe (e.g. indices). If it is constant at the example "
                    "inputs' shapes, the fold before annotation should have taken it: the quantization "
                    "report's folds say why it did not (a budget, a symbolic size)"
                    if where and stage == "calibrate" else ""
                )
            ) from exc
        self.info.stages.append((stage, time.perf_counter() - t))
        return value


def _graph_node_that_raised(exc: BaseException) -> str:
    """`` at node 'index' (torch.ops.aten.index.Tensor(...), from model.py:12)``: the innermost line of an
    fx-generated forward in ``exc``'s traceback, and the model line its node came from; "" if none."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<eval_with_key>")]
    if not frames:
        return ""
    frame = frames[-1]
    line = (linecache.getline(frame.filename, frame.lineno) or frame.line or "").strip()
    m = _re.match(r"^([A-Za-z_]\w*)\s*=\s*(.*)$", line)
    if not m:
        return f" in the graph's code ({line})" if line else ""
    name, call = m.group(1), m.group(2)
    source = ""
    gm = frame_gm = None
    tb = exc.__traceback__
    while tb is not None:  # the GraphModule whose forward raised: its node holds the model's line
        if tb.tb_frame.f_code.co_filename == frame.filename:
            frame_gm = tb.tb_frame.f_locals.get("self")
        tb = tb.tb_next
    gm = frame_gm
    node = next((n for n in gm.graph.nodes if n.name == name), None) if hasattr(gm, "graph") else None
    trace = (node.meta.get("stack_trace") or "").strip().splitlines() if node is not None else []
    files = [t.strip() for t in trace if t.strip().startswith("File ")]
    if files:
        source = f", from {files[-1].removeprefix('File ')}"
    return f" at node {name!r} ({call[:120]}{source})"


def _calibrate(prepared: Any, calibration: Any, given: Any, info: Any) -> None:
    # torch: loaded when quantizing; the CLI's startup imports this module
    import torch

    with torch.no_grad():
        if calibration is None:  # the example inputs, keywords included
            _refuse_non_finite((given.args, given.kwargs), "the example inputs (they calibrate when no calibration data is given)")
            prepared(*given.args, **given.kwargs)
            info.calibration_batches += 1
        for batch in calibration or ():
            if info.calibration_batches >= info.calibration_limit:
                info.calibration_cut = True  # more than the cap: the rest is not read (a generator may never end)
                break
            args = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
            _refuse_non_finite(args, f"calibration batch {info.calibration_batches}")
            prepared(*args)
            info.calibration_batches += 1
    if info.calibration_batches == 0:
        raise QuantizationError("the calibration data is empty: give at least one input tuple")


def _refuse_non_finite(inputs: Any, what: str) -> None:
    """A ``QuantizationError`` naming the input of ``what`` that holds NaN or an infinity: an observer takes
    each activation's range from the calibration data, and a non-finite value leaves none (the quantizer's
    annotation would be blamed, where the data is at fault)."""
    import torch  # loaded when quantizing, as in _calibrate
    import torch.utils._pytree as pytree  # with torch, as above

    for i, leaf in enumerate(pytree.tree_leaves(inputs)):
        if isinstance(leaf, torch.Tensor) and (leaf.is_floating_point() or leaf.is_complex()):
            bad = int((~torch.isfinite(leaf)).sum())
            if bad:
                nans = int(torch.isnan(leaf).sum())
                raise QuantizationError(
                    f"{what}, input {i} (shape {tuple(leaf.shape)}), holds {nans} NaN and {bad - nans} infinite "
                    f"value{'s' if bad != 1 else ''}: calibration data must be finite, since each observer takes an "
                    "activation's range from it. The data is at fault, not the quantizer: give finite calibration inputs"
                )


def _float_outputs(model: Any, given: Any) -> list[Any]:
    # torch: loaded when quantizing; the CLI's startup imports this module
    from torch.export import ExportedProgram

    from edgeplug._eager import EagerModel

    # on copies of the buffers, parameters shared: a KV cache written under grad mode copies too
    eager = EagerModel.of_program(model) if isinstance(model, ExportedProgram) else EagerModel.of_module(model)
    return eager(given).outputs


# -- lowering a quantized program ----------------------------------------------------


def check_calibration_batches(value: Any) -> int:
    """``value`` as a cap on calibration batches (an int >= 1); raises ``QuantizationError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise QuantizationError(
            f"calibration_batches must be a whole number >= 1, not {value!r} "
            f"(the default, {DEFAULT_CALIBRATION_BATCHES}, caps what a generator that never ends gives)"
        )
    return value


def load_calibration(spec: str, limit: int = DEFAULT_CALIBRATION_BATCHES) -> list[tuple]:
    """``FILE.py:ATTR`` -> a list of input tuples: ATTR is such an iterable, or a callable returning one.

    At most ``limit`` + 1 are read (one more than the cap, so ``quantize`` can
    say the data had more): a generator that never ends is cut.
    """
    limit = check_calibration_batches(limit)
    if ":" not in spec:
        raise QuantizationError(f"--calibration {spec!r}: expected FILE.py:ATTR")

    module, attr, path_s = import_user_file(spec, "calibration file", error=QuantizationError)
    try:
        value = getattr(module, attr)
        data = value() if callable(value) else value
        batches = [tuple(b) if isinstance(b, (tuple, list)) else (b,) for b in itertools.islice(data, limit + 1)]
    except AttributeError as exc:
        raise QuantizationError(f"{path_s} has no {attr!r}: it must name input tuples, or a callable returning them") from exc
    except Exception as exc:
        raise QuantizationError(f"loading calibration data {spec} failed: {type(exc).__name__}: {exc}") from exc
    if not batches:
        raise QuantizationError(f"{spec} gave no calibration inputs: give at least one input tuple")
    return batches

__all__ = [
    "DEFAULT_CALIBRATION_BATCHES",
    "QuantizationError",
    "check_calibration_batches",
    "load_calibration",
    "make_quantizer",
    "quant_scheme",
    "quantize_for_backend",
    "recompose_norms",
    "schemes",
]
