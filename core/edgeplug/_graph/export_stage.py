"""The export stage, which ``lower`` and ``quantize`` both run on the aten program: the backend's
export passes, then the core's decompositions of what ``to_edge`` cannot take (``edgeplug.transform``
runs it alone: ``run_export_stage``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch.export import ExportedProgram

from edgeplug._graph.decompose import export_decompositions
from edgeplug._graph.names import copy_exported_program
from edgeplug._graph.passes import run_passes
from edgeplug._records import PassSpec

if TYPE_CHECKING:  # the graph floor reads what a Backend holds, never the registry's modules
    from edgeplug._backend import Backend


def export_stage_passes(ep: ExportedProgram, backend: Backend) -> list[PassSpec]:
    """The backend's export passes, then the core's decompositions (aten.histc, ...:
    ``edgeplug._graph.decompose``), each added only where ``ep`` has one."""
    return [*backend.passes_for("export"), *export_decompositions(ep, backend)]


def run_export_stage(ep: ExportedProgram, backend: Backend) -> ExportedProgram:
    """Run the export stage on an aten-dialect program; ``ep`` is left as it was (``edgeplug.transform``
    resolves a name, then runs this)."""
    if isinstance(backend, str):  # the façade resolves a name, against the registry the caller chose
        raise TypeError(
            f"edgeplug._graph.export_stage.run_export_stage takes a Backend, not the name {backend!r}: "
            "call edgeplug.transform, or resolve it with edgeplug.get_backend(name)"
        )
    passes = export_stage_passes(ep, backend)
    return run_passes(copy_exported_program(ep), passes, backend=backend).program if passes else ep
