"""How a lowering holds the model's weights: shared with the caller, never copied; optionally external.

A decoder's weights are most of its memory, so a lowering that copies them once
needs twice the model. Two places copy them unless told not to:

- ``shared_weights_in_preprocess``: executorch deep-copies every partition's
  program before the delegates' preprocess runs
  (``BackendDetails.copy_exported_program_for_preprocess``: 1x the delegated
  weights, all alive while the first partition is preprocessed). Inside it, a deep
  copy of an ExportedProgram shares the program's parameters and constants
  (the graph, signature and buffers are still copied). A preprocess reads
  weights and writes what it makes into its own blob; one that wrote a weight
  in place would change the caller's model, which the core's tests check.
- the eager reference and the export copy share the caller's parameters
  (``edgeplug._eager``, ``edgeplug._pipeline``).

External weights (``lower(..., external_weights=True)``): every parameter's
placeholder is tagged with ``DATA_TAG`` (``meta["custom"]["delegate_constant_tag"]``),
which a delegate that supports it (``BackendSpec.external_weights``) reads to put
the weight into executorch's named data under that tag, and ``to_executorch``
moves the parameters left on the CPU there too (``ExecutorchBackendConfig.external_constants``).
The ``.pte`` then holds no weight; ``LoweringResult.save`` writes them once, into
``<name>.ptd`` beside ``<name>.pte``. Until then each weight waits in a temporary
file (``spilled_weights``), not in memory.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator

from torch.export import ExportedProgram

from edgeplug._errors import EdgeplugError

#: the named-data tag (and executorch's data file name) the weights go under
DATA_TAG = "weights"


def check_external_weights(backend: Any) -> None:
    """Refuse external weights, before any work, for a backend whose preprocess does not take them."""
    if not backend.spec.external_weights:
        raise EdgeplugError(
            f"backend {backend.name!r} cannot put its weights into a .ptd: its delegate's preprocess does not "
            "store tagged weights in executorch's named data (its BackendSpec.external_weights is False, from "
            f"{backend.distribution}). Lower without external_weights (--external-weights) to keep the weights "
            "in the .pte; nothing was done"
        )


def tag_external(ep: ExportedProgram) -> int:
    """Tag every parameter placeholder of ``ep`` for the delegate's named data; returns how many."""
    names = set(ep.graph_signature.inputs_to_parameters)
    count = 0
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name in names:
            node.meta.setdefault("custom", {})["delegate_constant_tag"] = DATA_TAG
            count += 1
    return count


def external_constants(node: Any) -> str:
    """``ExecutorchBackendConfig.external_constants``: a parameter left on the CPU goes to the same data file."""
    return DATA_TAG


@contextlib.contextmanager
def shared_weights_in_preprocess() -> Iterator[None]:
    """Inside: executorch's ``to_backend`` deep-copies a partition's program without copying its weights."""
    from executorch.exir.backend import backend_api, backend_details

    # backend_details: BackendDetails.copy_exported_program_for_preprocess (every partition's copy is made
    # before the first preprocess runs); backend_api: to_backend of one program
    modules = (backend_api, backend_details)

    class _SharingCopy:
        """``copy`` as backend_api uses it, with ``deepcopy`` sharing an ExportedProgram's weights."""

        def __getattr__(self, name: str) -> Any:
            return getattr(copy, name)

        @staticmethod
        def deepcopy(x: Any, memo: Any = None) -> Any:
            if isinstance(x, ExportedProgram):
                memo = dict(memo or {})
                for name, t in [*x.state_dict.items(), *x.constants.items()]:
                    if name not in x.graph_signature.buffers_to_mutate.values():
                        memo.setdefault(id(t), t)
            return copy.deepcopy(x, memo)

    originals = [m.copy for m in modules]
    for m in modules:
        m.copy = _SharingCopy()
    try:
        yield
    finally:
        for m, original in zip(modules, originals):
            m.copy = original


#: named data this large or larger, under ``DATA_TAG``, waits on disk for the .ptd (``spilled_weights``)
SPILL_BYTES = 1 << 16


@contextlib.contextmanager
def spilled_weights() -> Iterator[None]:
    """Inside: weights a delegate's preprocess (or ``to_executorch``) puts into named data under ``DATA_TAG``
    go to a temporary file at once, as executorch's own ``FileBackedData``, instead of staying in memory
    as bytes until the .ptd is written; each file is removed when the program holding it is released."""
    import os
    import tempfile

    from executorch.exir._serialize._cord import FileBackedData
    from executorch.exir._serialize._named_data_store import NamedDataStore

    original = NamedDataStore.add_named_data

    def add_named_data(self: Any, key: str, data: Any, alignment: Any = 1, external_tag: Any = None, **kw: Any) -> None:
        if external_tag == DATA_TAG and isinstance(data, (bytes, bytearray)) and len(data) >= SPILL_BYTES:
            fd, path = tempfile.mkstemp(prefix="edgeplug-weight-", suffix=".bin")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            except BaseException:
                os.remove(path)
                raise
            data = FileBackedData(path, cleanup=True)
        original(self, key, data, alignment, external_tag, **kw)

    NamedDataStore.add_named_data = add_named_data
    try:
        yield
    finally:
        NamedDataStore.add_named_data = original


def data_files(program: Any) -> dict[str, Any]:
    """The serialized program's data files (executorch's named data outside the .pte): tag -> what
    streams itself into a file (``write_to_file``), never joined into one bytes object."""
    cords = getattr(program, "_tensor_data", None)  # executorch 1.5.1 keeps them beside the .pte's pieces
    if cords is None and hasattr(program, "data_files"):
        return dict(program.data_files)
    return dict(cords or {})


def ptd_path(pte: Any) -> Any:
    """Where the weights of ``pte`` go: ``model.pte`` -> ``model.ptd``."""
    from pathlib import Path

    return Path(pte).with_suffix(".ptd")


def check_saved_whole(program: Any, tags: dict[str, Any]) -> None:
    if len(tags) > 1:
        raise EdgeplugError(
            f"the program's named data went into {len(tags)} data files ({', '.join(sorted(tags))}), "
            f"where edgeplug writes one .ptd: a delegate tagged weights other than {DATA_TAG!r}"
        )
