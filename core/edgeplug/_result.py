"""``LoweringResult``: what ``lower`` returns, the report and the programs at each stage."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from torch.export import ExportedProgram

from edgeplug._eager import Reference
from edgeplug._errors import EdgeplugError, VerificationError
from edgeplug._inputs import ExampleInputs, runtime_inputs
from edgeplug._outputs import PathArg, check_output_paths, write_files
from edgeplug._quantize.program import QuantizationInfo
from edgeplug._report.records import LoweringReport, stand_in_path
from edgeplug._weights import check_saved_whole, check_weights_target, data_files


@dataclass
class LoweringResult:
    """What ``lower`` returns: the report, the programs at each stage, and ``save`` for the .pte."""

    report: LoweringReport
    exported_program: ExportedProgram
    edge: Any  # executorch EdgeProgramManager: the edge-dialect program as partitioned, before serialization
    program: Any = None  # executorch ExecutorchProgramManager (None on dry run)
    #: the example inputs the program was lowered (and is verified) with: ``model(*args, **kwargs)``
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    reference: Optional[Reference] = None
    #: what ``quantize`` did, where the lowered model came from it (verification's tolerance and |lowered - float|)
    quantization: Optional[QuantizationInfo] = None
    #: the .pte's size in bytes (None on dry run)
    pte_bytes: Optional[int] = None
    #: ExecuTorch's ETRecord of the lowering (``lower(..., etrecord=True or PATH)``; else None): the aten, edge and
    #: executorch programs, which ``executorch.devtools.Inspector`` reads beside the .pte's ETDump
    etrecord: Any = None

    def lowered_program(self) -> ExportedProgram:
        """The program as ExecuTorch's runtime runs it: the executorch-dialect program ``to_executorch`` made
        (``program``'s; its cache writes in place, buffers written back), or the edge program where there is none
        (a dry run). Verification runs this one; ``edge`` is the program as partitioned, before serialization."""
        if self.program is not None:
            return self.program.exported_program()
        if self.edge is None:
            raise EdgeplugError("the lowering result holds no program")
        return self.edge.exported_program()

    def runtime_inputs(self) -> list[Any]:
        """The example inputs as the ``.pte``'s method takes them: one flat list in the program's input order
        (keyword inputs in the order of its in-spec, ``None`` and scalars included)."""
        return runtime_inputs(self.exported_program, ExampleInputs(self.args, self.kwargs))

    @property
    def eager_outputs(self) -> list[torch.Tensor]:
        return self.reference.outputs if self.reference is not None else []

    @property
    def buffer(self) -> bytes:
        if self.program is None:
            raise EdgeplugError("this was a dry run: there is no .pte to write")
        return self.program.buffer

    @property
    def data_buffer(self) -> Optional[bytes]:
        """The weights' data file (``.ptd``) of a lowering with external weights, else None."""
        files = data_files(self.program) if self.program is not None else {}
        return bytes(next(iter(files.values()))) if files else None

    def save(
        self, path: str | os.PathLike, report: Optional[str | os.PathLike] = None, *, force: bool = False,
        stand_in: bool = False,
    ) -> Path:
        """Write the .pte (and the JSON report, with ``report``): each file whole or not at all.

        A regular file is replaced atomically; ``-`` (stdout), a FIFO or a
        character device is streamed (``edgeplug._outputs``). A result whose
        verification failed is refused (``VerificationError``) unless ``force``.
        A program whose delegates hold stand-in payloads (``report.stand_in``:
        it does not run) is refused unless ``stand_in``; then it is written as
        ``STEM.stand-in.pte`` beside ``path`` (the path returned), never under
        a name a runnable program would have.
        """
        v = self.report.verification
        if v is not None and not v.passed and not force:
            raise VerificationError(
                f"not saving {os.fspath(path)}: verification failed ({' | '.join(v.failures())}); "
                "the runtime would compute something else. Fix the lowering, or pass force=True to write it anyway"
            )

        held = self.report.stand_in
        if self.program is None:
            raise EdgeplugError(
                "this was a dry run: there is no .pte to write (lower(..., dry_run=True, keep_stand_in=True) keeps "
                "its stand-in program, which save(path, stand_in=True) writes as STEM.stand-in.pte)"
            )
        if held is not None and not stand_in:
            raise EdgeplugError(
                f"not saving {os.fspath(path)}: {held.reason}. Pass stand_in=True to write it anyway, as "
                f"{stand_in_path(path) if os.fspath(path) != '-' else 'a .stand-in.pte file'}"
            )
        if held is not None:
            if os.fspath(path) == "-":
                raise EdgeplugError("a stand-in program is written to a file named STEM.stand-in.pte, not to '-'")
            path = stand_in_path(path)
        weights = data_files(self.program)
        check_saved_whole(self.program, weights)
        # the .pte and its .ptd are written together or not at all (edgeplug._weights, edgeplug._outputs)
        ptd = check_weights_target(path) if weights else None
        targets = {"the .pte": path, "the report": report, "the weights (.ptd)": ptd}
        check_output_paths(targets)
        path = Path(path) if os.fspath(path) != "-" else path
        self.report.output_path = str(path)
        self.report.output_bytes = self.pte_bytes if self.pte_bytes is not None else len(self.buffer)
        if held is not None:
            held.written = str(path)
        # the program streams its serialized pieces into the file: the .pte is never one bytes object here
        files: dict[PathArg, Any] = {path: self.program}
        if ptd is not None:
            files[ptd] = next(iter(weights.values()))
        if report is not None:
            files[Path(report)] = self.report.to_json()
        try:
            write_files(files)
        except BaseException:
            self.report.output_path = self.report.output_bytes = None
            if held is not None:
                held.written = None
            raise
        return path  # type: ignore[return-value]  # "-" (stdout) comes back as given
