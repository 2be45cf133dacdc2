"""Stage helpers shared by ``lower`` and ``quantize``: the export stage (``transform``) and the
core's fusion (``fuse``).

Both pipelines import this module; it imports neither, so quantization sits below the lowering.
"""

from __future__ import annotations

from torch.export import ExportedProgram

from edgeplug._backend import Backend
from edgeplug._plugins import get_backend
from edgeplug._fusion import fuse_for_backend
from edgeplug._graph import run_passes
from edgeplug._graph.decompose import export_decompositions
from edgeplug._graph.names import copy_exported_program
from edgeplug._records import FusionRecord, PassSpec


def export_stage_passes(ep: ExportedProgram, backend: Backend) -> list[PassSpec]:
    """The backend's export passes, then the core's decompositions of what to_edge cannot take
    (aten.histc, ...: ``edgeplug._graph.decompose``), each added only where ``ep`` has one."""
    return [*backend.passes_for("export"), *export_decompositions(ep, backend)]


def transform(ep: ExportedProgram, backend: str | Backend) -> ExportedProgram:
    """Run the export stage ``lower`` runs (``backend``'s export passes, then the core's
    decompositions) on an aten-dialect program; ``ep`` is left as it was."""
    b = backend if isinstance(backend, Backend) else get_backend(backend)
    passes = export_stage_passes(ep, b)
    return run_passes(copy_exported_program(ep), passes, backend=b).program if passes else ep


def fuse(ep: ExportedProgram, backend: str | Backend) -> tuple[ExportedProgram, list[FusionRecord]]:
    """Apply the core's pattern fusions to an edge-dialect program under ``backend``'s policy.

    Returns a new program (``ep`` is not changed) and one ``FusionRecord`` per
    match: fused, folded, fused with a unit weight, or rejected with its reason.
    """
    return fuse_for_backend(ep, backend if isinstance(backend, Backend) else get_backend(backend))
