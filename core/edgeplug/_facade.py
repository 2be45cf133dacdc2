"""The user's façade: ``edgeplug.lower``, ``quantize``, ``verify``, ``fuse`` and ``transform``.

Here, and only here (with the CLI and the conformance suite), a backend given by name becomes a
``Backend``: once, against the process's registry (``edgeplug.get_backend``). A ``Backend`` given is
taken as it is, whichever registry resolved it (``edgeplug.get_backend(name, registry=pm)``), and
everything below reads that object: its quantize schemes, kernels, passes and partitioner, never the
process's plugin manager again.

Each function checks its arguments, resolves the backend, and hands both down; torch and executorch
load with the first call, so ``import edgeplug`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence

from edgeplug._backend import Backend
from edgeplug._errors import EdgeplugError
from edgeplug._quantize.quantize import DEFAULT_CALIBRATION_BATCHES, no_quantizer
from edgeplug._records import QuantScheme
from edgeplug._registry.lookup import backends, get_backend, manager

if TYPE_CHECKING:  # the signatures' names only: torch and executorch load with the first call
    import torch
    from torch.export import ExportedProgram

    from edgeplug._quantize.program import QuantizedModel
    from edgeplug._records import FusionRecord
    from edgeplug._report.records import Verification
    from edgeplug._result import LoweringResult

Progress = Callable[[str], None]


def resolve(backend: Any, where: str) -> Backend:
    """``backend`` as a ``Backend``: a name looked up once in the process's registry, a ``Backend`` as given."""
    if isinstance(backend, Backend):
        return backend
    if isinstance(backend, str):
        return get_backend(backend)
    raise EdgeplugError(
        f"{where}: the backend is a name (one of: {_installed()}) or a Backend (edgeplug.get_backend(name)), "
        f"not {type(backend).__name__}"
    )


def _installed() -> str:
    return ", ".join(backends()) or "none (pip install a backend plugin)"


def lower(
    model_or_ep: torch.nn.Module | ExportedProgram,
    args: Any = (),
    backend: str | Backend | None = None,
    *,
    kwargs: Optional[dict[str, Any]] = None,
    dynamic_shapes: Any = None,
    verify: bool = False,
    dry_run: bool = False,
    model_name: Optional[str] = None,
    progress: Optional[Progress] = None,
    tolerance: Optional[float] = None,
    verify_steps: Optional[int] = None,
    external_weights: bool = False,
    profile_memory: bool = False,
    keep_stand_in: bool = False,
    etrecord: Any = None,
) -> LoweringResult:
    """Lower a model (or aten-dialect ExportedProgram) for ``backend`` (a name, or a ``Backend``).

    The example inputs are one call's, as ``torch.export.export`` takes them:
    ``args`` the positional inputs (a tuple; one tensor is one input), ``kwargs``
    the keyword inputs (``edgeplug._inputs``). ``dynamic_shapes`` is passed to
    ``torch.export`` for a module; an ExportedProgram is taken as it was exported
    (keyword inputs and dynamic dimensions included), and the inputs must have
    its structure. A program that keeps state in buffers (a KV cache) is verified
    over several calls: the example inputs, then decode steps.

    Returns a ``LoweringResult``; ``.save(path)`` writes the .pte. With
    ``dry_run`` everything but serialization runs and the report says what
    would be delegated. With ``verify`` the lowered program is executed and
    compared against eager (``tolerance``: the max |difference| accepted;
    default by output dtype); ``report.verification.passed`` says whether it
    held. With ``verify_steps=N`` as well, a program that keeps a KV cache
    generates ``N`` tokens greedily from the example prompt (prefill, then
    one-token decode steps of the loaded ``.pte``), compared token for token
    with eager (the quantized model where quantized):
    ``report.verification.greedy`` names the first step that differs and
    eager's logit margin there. The caller's model, program and inputs are left as they were;
    the lowering shares their weights and never copies them.

    With ``external_weights`` the weights go into a ``.ptd`` that ``save``
    writes beside the ``.pte`` (executorch's named data; for backends whose
    ``BackendSpec.external_weights`` says their delegate stores them there,
    others refuse). With ``profile_memory`` each stage's peak resident
    memory is in ``report.stages`` (``edgeplug._memory``: Linux only).

    A program whose delegates hold stand-in payloads (a dry run; a backend's
    stand-in preprocess, recording the SDK's calls instead of compiling) does not run:
    ``report.stand_in`` says why, ``report.dry_run`` is true, and ``save``
    writes it only with ``stand_in=True``, as ``STEM.stand-in.pte``. A dry
    run keeps its serialized program for that only with ``keep_stand_in``.

    ``result.edge`` is the edge-dialect program as partitioned (serialization runs on a copy of its graph).
    With ``etrecord=True`` ExecuTorch's ETRecord of the lowering is kept as ``result.etrecord``; with
    ``etrecord=PATH`` it is also written there when the lowering ends (verification failed or not), for
    ExecuTorch's ``Inspector(etdump_path=..., etrecord=PATH)`` and its ``calculate_numeric_gap``. A dry run
    has none.
    """
    # torch, executorch: loaded with the first lowering (`import edgeplug` stays light)
    from edgeplug import _pipeline

    if backend is None:
        raise EdgeplugError(
            "edgeplug.lower needs a backend: lower(model, args, NAME) or backend=NAME, "
            f"NAME one of the installed backends: {_installed()}"
        )
    if isinstance(backend, dict):
        raise EdgeplugError(
            "edgeplug.lower: the third argument is the backend, not keyword inputs; pass them as kwargs={...}"
        )
    return _pipeline.run_lowering(
        model_or_ep, args, resolve(backend, "edgeplug.lower"), kwargs=kwargs, dynamic_shapes=dynamic_shapes,
        verify=verify, dry_run=dry_run, model_name=model_name, progress=progress, tolerance=tolerance,
        verify_steps=verify_steps, external_weights=external_weights, profile_memory=profile_memory,
        keep_stand_in=keep_stand_in, etrecord=etrecord,
    )


def quantize(
    model: Any,
    args: Any = (),
    backend: Any = None,
    scheme: Optional[str] = None,
    calibration: Optional[Iterable[Sequence[Any]]] = None,
    *,
    kwargs: Optional[dict[str, Any]] = None,
    dynamic_shapes: Any = None,
    progress: Optional[Progress] = None,
    calibration_batches: int = DEFAULT_CALIBRATION_BATCHES,
) -> QuantizedModel:
    """Quantize ``model`` with ``backend``'s quantizer for ``scheme`` (``backend``: a name, or a ``Backend``);
    returns a ``QuantizedModel``, which ``lower`` takes.

    ``args`` and ``kwargs`` are the example inputs as ``edgeplug.lower`` takes
    them; ``dynamic_shapes`` is passed to ``torch.export`` for a module.
    ``calibration`` is an iterable of positional input tuples (a single tensor
    counts as a one-input tuple) run through the observed model; by default the
    example inputs. At most ``calibration_batches`` batches are read (a
    generator that never ends is cut there); the report counts them and says
    when the data had more. The caller's model is not changed. The steps are
    ``edgeplug._quantize.quantize``'s.
    """
    from edgeplug._quantize.quantize import quantize_for_backend  # torch, torchao: with the first call

    if backend is None or scheme is None:
        raise EdgeplugError(
            "edgeplug.quantize needs a backend and a scheme: quantize(model, args, BACKEND, SCHEME) "
            "(edgeplug.backends() lists the backends; `edgeplug plugins` lists each backend's schemes)"
        )
    named = isinstance(backend, str)
    b = resolve(backend, "edgeplug.quantize")
    if named and not b.records(QuantScheme):  # the registry the name was read in knows who has one
        raise no_quantizer(b, backends_with_quantizers())
    return quantize_for_backend(
        model, args, b, scheme, calibration, kwargs=kwargs, dynamic_shapes=dynamic_shapes, progress=progress,
        calibration_batches=calibration_batches,
    )


def backends_with_quantizers() -> list[str]:
    """The process registry's backends that offer a quantization scheme."""
    m = manager()
    return sorted({c.record.backend for c in m.contributions(QuantScheme)} & set(m.backend_specs()))


def verify(
    result: LoweringResult, backend: str | Backend, *, tolerance: Optional[float] = None,
    reference: Optional[Sequence[torch.Tensor]] = None, verify_steps: Optional[int] = None,
) -> Verification:
    """Run the lowered program and compare each output with eager (``backend``: a name, or a ``Backend``).

    ``BackendSpec.verify_method`` says how the program runs here. ``tolerance``
    is the max |difference| accepted (default by output dtype; see
    ``edgeplug._verify.compare``); ``reference`` replaces eager's outputs (e.g. a
    quantized model's). NaN and infinities are compared by position.
    ``Verification.passed`` says whether it held.

    With ``verify_steps`` (a program that keeps a KV cache), that many tokens are also
    generated greedily through the loaded program (where the other calls ran: the
    backend's own runtime, executorch's runtime or the host emulation) and through
    eager (the quantized model where quantized), and compared token for token:
    ``Verification.greedy`` (``edgeplug._verify.greedy``; ``GreedyCheck.runner``).
    """
    # torch, executorch: with the first call
    from edgeplug._verify import verify_lowering
    from edgeplug._verify.options import verify_options

    options = verify_options(True, verify_steps, tolerance)  # the flags checked once, here
    assert options is not None
    return verify_lowering(
        result, resolve(backend, "edgeplug.verify"), tolerance=options.tolerance, reference=reference,
        verify_steps=options.steps,
    )


def fuse(ep: ExportedProgram, backend: str | Backend) -> tuple[ExportedProgram, list[FusionRecord]]:
    """The core's pattern fusions on an edge-dialect program under ``backend``'s policy (a name or a
    ``Backend``), only where the backend would delegate the fused op. Returns a new program (``ep`` is not
    changed) and one ``FusionRecord`` per match: fused, folded, fused with a unit weight, or rejected with
    its reason."""
    # torch, executorch: with the first call
    from edgeplug._fusion.program import fuse_for_backend
    from edgeplug._partition.delegation import delegation

    b = resolve(backend, "edgeplug.fuse")
    return fuse_for_backend(ep, b, delegation(b))


def transform(ep: ExportedProgram, backend: str | Backend) -> ExportedProgram:
    """The export stage ``lower`` runs, alone, on an aten-dialect program: ``backend``'s export passes, then
    the core's decompositions of what ``to_edge`` cannot take. ``ep`` is left as it was."""
    from edgeplug._graph.export_stage import run_export_stage  # torch: with the first call

    return run_export_stage(ep, resolve(backend, "edgeplug.transform"))


__all__ = ["backends_with_quantizers", "fuse", "lower", "quantize", "resolve", "transform", "verify"]
