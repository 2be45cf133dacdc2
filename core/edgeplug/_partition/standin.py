"""The dry run's stand-in delegate.

A dry run is a real lowering in which only the delegate's preprocess (the
vendor SDK's compile step) is replaced: the partitions are tagged and lowered
exactly as in a real run, so every check ExecuTorch makes (the edge IR
verifier included, and the serialization of the program around the
delegates) runs, and a program that would fail for real fails in the dry run
in the same stage, with the same message. ``CorePartitioner`` hands each
partition to ``StandInBackend`` instead of the backend's own id; the report
names the real backend.

Where the backend's compile step can run here (its availability says it can
serialize), the stand-in runs the real preprocess first and drops what it
makes, so a partition the compile step refuses fails the dry run as it fails a
real lowering; only where it cannot run (no SDK) is it skipped.
"""

from __future__ import annotations

from typing import Any, Optional

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec

from edgeplug._errors import BackendUnavailableError

#: the backend id a dry run's partitions are lowered to (executorch looks backends up by class name)
STAND_IN_ID = "EdgeplugStandInBackend"
#: the compile spec naming the real backend whose preprocess the stand-in runs first (taken out of the specs
#: that preprocess is given)
CHECK_WITH = "edgeplug_check_with"


def check_with(backend_id: str) -> CompileSpec:
    """The compile spec that makes the stand-in run ``backend_id``'s own preprocess before its own."""
    return CompileSpec(CHECK_WITH, backend_id.encode())


def _details_named(backend_id: str) -> Optional[type]:
    todo: list[Any] = list(BackendDetails.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__name__ == backend_id:
            return cls
    return None


class EdgeplugStandInBackend(BackendDetails):
    """Preprocess of a dry run: the partition's program is taken as it is and nothing is kept of a compile."""

    @staticmethod
    def preprocess(edge_program, compile_specs):  # noqa: ANN001, ANN205 (executorch's signature)
        named = [s for s in compile_specs if s.key == CHECK_WITH]
        real = _details_named(named[0].value.decode()) if named else None
        if real is not None:  # the compile step runs here: what it refuses, the dry run refuses too
            _compile(real, edge_program, [s for s in compile_specs if s.key != CHECK_WITH])
        return PreprocessResult(processed_bytes=b"")


def _compile(real: Any, edge_program: Any, specs: list) -> None:
    """The real backend's compile step on one partition, as executorch calls it (``preprocess_multimethod`` where
    the class has one: QNN's saver replaces that); what it makes is dropped. A backend that raises
    ``BackendUnavailableError`` says this machine cannot compile for it after all (an SDK of another release):
    the dry run then stands in, as it does where the backend is unavailable."""
    try:
        if callable(getattr(real, "preprocess_multimethod", None)):
            real.preprocess_multimethod({"forward": [edge_program]}, {"forward": [specs]})
        else:
            real.preprocess(edge_program, specs)
    except BackendUnavailableError:
        return


assert EdgeplugStandInBackend.__name__ == STAND_IN_ID

__all__ = ["STAND_IN_ID", "EdgeplugStandInBackend"]
