"""The dry run's stand-in delegate.

A dry run is a real lowering in which only the delegate's preprocess (the
vendor SDK's compile step) is replaced: the partitions are tagged and lowered
exactly as in a real run, so every check ExecuTorch makes (the edge IR
verifier included, and the serialization of the program around the
delegates) runs, and a program that would fail for real fails in the dry run
in the same stage, with the same message. ``CorePartitioner`` hands each
partition to ``StandInBackend`` instead of the backend's own id; the report
names the real backend.
"""

from __future__ import annotations

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult

#: the backend id a dry run's partitions are lowered to (executorch looks backends up by class name)
STAND_IN_ID = "EdgeplugStandInBackend"


class EdgeplugStandInBackend(BackendDetails):
    """Preprocess of a dry run: the partition's program is taken as it is and nothing is compiled."""

    @staticmethod
    def preprocess(edge_program, compile_specs):  # noqa: ANN001, ANN205 (executorch's signature)
        return PreprocessResult(processed_bytes=b"")


assert EdgeplugStandInBackend.__name__ == STAND_IN_ID

__all__ = ["STAND_IN_ID", "EdgeplugStandInBackend"]
