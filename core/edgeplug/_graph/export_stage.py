"""The export stage, which ``lower`` and ``quantize`` both run on the aten program: the backend's
export passes, then the core's decompositions of what ``to_edge`` cannot take (``edgeplug.transform``
runs it alone)."""

from __future__ import annotations

from torch.export import ExportedProgram

from edgeplug._backend import Backend
from edgeplug._graph.decompose import export_decompositions
from edgeplug._graph.names import copy_exported_program
from edgeplug._graph.passes import run_passes
from edgeplug._records import PassSpec
from edgeplug._registry.lookup import get_backend


def export_stage_passes(ep: ExportedProgram, backend: Backend) -> list[PassSpec]:
    """The backend's export passes, then the core's decompositions (aten.histc, ...:
    ``edgeplug._graph.decompose``), each added only where ``ep`` has one."""
    return [*backend.passes_for("export"), *export_decompositions(ep, backend)]


def transform(ep: ExportedProgram, backend: str | Backend) -> ExportedProgram:
    """Run the export stage on an aten-dialect program; ``ep`` is left as it was."""
    b = backend if isinstance(backend, Backend) else get_backend(backend)
    passes = export_stage_passes(ep, b)
    return run_passes(copy_exported_program(ep), passes, backend=b).program if passes else ep
