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

Once serialized (by a delegate's preprocess, or by the emitter for a weight left
on the CPU) a weight waits in a temporary file, never in memory, until the .pte
(or .ptd) is written from it (``spilled_weights``); the files go with the result
(``lowered_modules_released`` keeps torch's and executorch's caches from holding it).

External weights (``lower(..., external_weights=True)``): every parameter's
placeholder is tagged with ``DATA_TAG`` (``meta["custom"]["delegate_constant_tag"]``),
which a delegate that supports it (``BackendSpec.external_weights``) reads to put
the weight into executorch's named data under that tag, and ``to_executorch``
moves the parameters left on the CPU there too (``ExecutorchBackendConfig.external_constants``).
A delegate's untagged named data (the Vulkan delegate's constants) goes there too.
The ``.pte`` then holds no weight; ``LoweringResult.save`` writes them once, into
``<name>.ptd`` beside ``<name>.pte``: the two together or neither (``check_weights_target``
refuses, before any work on the command line, a ``.ptd`` path that is not this pair's to replace).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterator

from executorch.exir.backend.utils import is_same_node
from executorch.exir.lowered_backend_module import LoweredBackendModule
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export import ExportedProgram

from edgeplug import _executorch
from edgeplug._errors import EdgeplugError, OutputPathError
from edgeplug._outputs import is_stream

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
    # the copies: BackendDetails.copy_exported_program_for_preprocess (every partition's copy is made before the
    # first preprocess runs, where the release has it) and to_backend of one program
    def sharing_deepcopy(x: Any, memo: Any = None) -> Any:
        if isinstance(x, ExportedProgram):
            memo = dict(memo or {})
            for name, t in [*x.state_dict.items(), *x.constants.items()]:
                if name not in x.graph_signature.buffers_to_mutate.values():
                    memo.setdefault(id(t), t)
        return copy.deepcopy(x, memo)

    with _executorch.deepcopy_in_to_backend(sharing_deepcopy):
        yield


#: a weight this large or larger waits on disk, not in memory, once serialized (``spilled_weights``)
SPILL_BYTES = 1 << 16

@functools.lru_cache(maxsize=1)
def _spilled_weight_class() -> Any:
    """A weight's bytes in a temporary file, never copied (the file does not change); None where the installed
    ExecuTorch cannot stream serialized bytes from a file (then weights stay in memory until written)."""
    base = _executorch.file_backed_data()
    if base is None:
        return None

    class SpilledWeight(base):  # type: ignore[misc, valid-type]
        def __deepcopy__(self, memo: Any) -> Any:
            # serialize_pte_binary deep-copies the emitted program, constants included
            return self

    return SpilledWeight


def spills() -> bool:
    """Whether serialized weights wait in temporary files here (the installed ExecuTorch can stream them)."""
    return _spilled_weight_class() is not None


def _spill(data: bytes | bytearray) -> Any:
    """``data`` written to a temporary file at once; what stands in for it (executorch's ``FileBackedData``,
    which serializers stream from the file) removes the file when it is released."""
    fd, path = tempfile.mkstemp(prefix="edgeplug-weight-", suffix=".bin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        os.remove(path)
        raise
    return _spilled_weight_class()(path, cleanup=True)


@contextlib.contextmanager
def spilled_weights(external: bool = False) -> Iterator[None]:
    """Inside: every serialized weight goes to a temporary file as soon as it is made, instead of
    staying in memory as bytes until the .pte (or .ptd) is written. Two places make them:

    - a delegate's preprocess (and ``to_executorch``, merging the delegates' stores) puts each weight
      into executorch's named data (``NamedDataStore.add_named_data``);
    - the emitter turns each constant left on the CPU into bytes (``_Emitter._save_new_const_tensor``).

    With ``external``, named data a delegate would store in the .pte (untagged: every constant of the
    Vulkan delegate's, XNNPACK's constants that are not parameters) goes under ``DATA_TAG`` too, so the
    .ptd holds every constant the delegates store. Each file is removed
    when the program holding it is released. Temporary files go where ``tempfile`` puts them (``TMPDIR``);
    on a memory-backed file system they still take memory, outside this process's resident set.
    """
    spill = spills()

    def named_data(data: Any, external_tag: Any) -> tuple[Any, Any]:
        if external and external_tag is None:
            external_tag = DATA_TAG
        if spill and isinstance(data, (bytes, bytearray)) and len(data) >= SPILL_BYTES:
            data = _spill(data)
        return data, external_tag

    def constant(buffer_data: Any, allocation_info: Any) -> Any:
        # a mutable buffer's initial state (allocation_info) stays as it is: only constants are spilled
        if spill and allocation_info is None and isinstance(buffer_data, bytes) and len(buffer_data) >= SPILL_BYTES:
            buffer_data = _spill(buffer_data)
        return buffer_data

    with _executorch.serialized_weights_intercepted(named_data, constant):
        yield


@contextlib.contextmanager
def lowered_modules_released() -> Iterator[None]:
    """On exit: torch's fake-tensor dispatch cache (``FakeTensorMode.cache``, one for the process) forgets
    the delegates this lowering made. Each ``executorch_call_delegate`` traced with fake tensors leaves a
    cache key holding its ``LoweredBackendModule``, so every delegate blob and its named data (the weights,
    or their temporary files) would outlive the lowering's result until the process ends; executorch's
    ``is_same_node`` cache is cleared for the same reason."""
    try:
        yield
    finally:
        def holds_delegate(key: Any) -> bool:
            return any(
                isinstance(v, LoweredBackendModule)
                or (isinstance(v, tuple) and any(isinstance(x, LoweredBackendModule) for x in v))
                for v in key.key
            )

        for key in [k for k in FakeTensorMode.cache if holds_delegate(k)]:
            del FakeTensorMode.cache[key]
        # executorch's node comparison caches every pair of nodes it saw (an unbounded lru_cache), and a node
        # holds its graph module: the lowered program, delegates included
        is_same_node.cache_clear()


def data_files(program: Any) -> dict[str, Any]:
    """The serialized program's data files (executorch's named data outside the .pte): tag -> what
    streams itself into a file (``write_to_file``), never joined into one bytes object."""
    _pte, cords = _executorch.serialized_pieces(program)
    if cords is None and hasattr(program, "data_files"):
        return dict(program.data_files)
    return dict(cords or {})


def serialized_size(program: Any) -> int:
    """The .pte's size in bytes: ``to_executorch`` serialized it into pieces (a ``Cord``: bytes and the
    weights' temporary files), so their sizes add up without reading or joining them."""
    pieces, _data = _executorch.serialized_pieces(program)
    if pieces is not None:
        return len(pieces)

    class Count:
        bytes = 0

        def write(self, data: Any) -> int:
            Count.bytes += len(data)
            return len(data)

    program.write_to_file(Count())
    return Count.bytes


def ptd_path(pte: Any) -> Any:
    """Where the weights of ``pte`` go: ``model.pte`` -> ``model.ptd``."""
    return Path(pte).with_suffix(".ptd")


#: where an ExecuTorch data file (.ptd: a FlatTensor flatbuffer) carries its file identifier
_PTD_IDENTIFIER = (slice(4, 8), b"FT01")


def _is_data_file(path: Any) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return False
    where, ident = _PTD_IDENTIFIER
    return head[where] == ident


def check_weights_target(pte: Any) -> Any:
    """The ``.ptd`` beside ``pte``, refused (``OutputPathError``) where the pair cannot be written together.

    The .pte's rules (``edgeplug._outputs``) hold for it, and since its name is not the user's but
    derived from the .pte's, edgeplug replaces nothing there that is not this pair's:

    - ``pte`` a stream (``-``, a FIFO, a device): a pair is two files;
    - the ``.ptd`` a folder, a symbolic link (it would write through into a file the user did not
      name), a socket or a device;
    - an existing file that is not an ExecuTorch data file;
    - an existing data file with no ``.pte`` beside it: it is not the pair being replaced but another
      program's weights (programs may share one .ptd).

    Replacing a ``.pte`` and the ``.ptd`` beside it replaces the pair, as replacing a ``.pte`` does.
    """
    if is_stream(pte):
        raise OutputPathError(
            f"cannot write {os.fspath(pte)} with external weights: a program with external weights is two "
            "files (.pte and .ptd): give a file path (-o FILE.pte), not a stream"
        )
    ptd = ptd_path(pte)
    if os.path.islink(ptd):
        raise OutputPathError(
            f"cannot write the weights (.ptd) {ptd}: it is a symbolic link (to {os.readlink(ptd)}), and edgeplug "
            "writes a .pte's weights as a file of its own beside it, never through a link it was not given: "
            "remove the link, or give -o another name; nothing was written"
        )
    try:
        mode = os.stat(ptd).st_mode
    except OSError:
        return ptd  # nothing there (or a folder on the way that the .pte's checks refuse)
    if stat.S_ISDIR(mode):
        raise OutputPathError(
            f"cannot write the weights (.ptd) {ptd}: it is a folder, where the weights of {os.fspath(pte)} go: "
            "move the folder, or give -o another name; nothing was written"
        )
    if not stat.S_ISREG(mode):
        raise OutputPathError(
            f"cannot write the weights (.ptd) {ptd}: it is not a regular file, which edgeplug never replaces: "
            "give -o another name; nothing was written"
        )
    if not _is_data_file(ptd):
        raise OutputPathError(
            f"cannot write the weights (.ptd) {ptd}: a file that is not an ExecuTorch data file is there, and "
            "edgeplug replaces only the .pte's own weights: move it, or give -o another name; nothing was written"
        )
    if not os.path.isfile(pte):
        raise OutputPathError(
            f"cannot write the weights (.ptd) {ptd}: it holds another program's weights (there is no "
            f"{os.path.basename(os.fspath(pte))} beside it whose pair it is, and programs may share a .ptd): "
            "remove it if it is no one's, or give -o another name; nothing was written"
        )
    return ptd


def check_saved_whole(program: Any, tags: dict[str, Any]) -> None:
    if len(tags) > 1:
        raise EdgeplugError(
            f"the program's named data went into {len(tags)} data files ({', '.join(sorted(tags))}), "
            f"where edgeplug writes one .ptd: a delegate tagged weights other than {DATA_TAG!r}"
        )
