"""QNN saver mode: every partition through Qualcomm's QNN interface, without a device.

Turned on by ``EDGEPLUG_QNN_SAVER=1`` (with ``QNN_SDK_ROOT`` naming a folder
whose ``lib/x86_64-linux-clang`` holds the QNN libraries, that folder on
``LD_LIBRARY_PATH`` before Python starts). The x86-64 libraries of the
``onnxruntime-qnn`` wheel are enough: their HTP device cannot be created by
ExecuTorch 1.5.1 (built for QNN 2.37: "unknown custom config socModel"), but
QNN's *saver* backend can. A lowering in this mode is a real lowering: the
partitioner is ExecuTorch's ``QnnPartitioner`` with saver compile specs, and
each partition's preprocess is ExecuTorch's ``QnnBackend`` one, running the
QNN preprocess passes and every op builder (``RmsNorm`` for ``aten.rms_norm``,
...) through the QNN interface, which the saver records as C source
(``saver_output.c``) instead of compiling.

What this proves and what it does not: every partition is translated by
ExecuTorch's QNN op builders into QNN graph, tensor and node calls that QNN
accepted. The saver validates no op against the HTP (it accepts every op
config), so HTP-specific refusals show only on a device.

What is written: nothing runnable. Each delegate's payload is a stand-in,
``PAYLOAD_MAGIC`` followed by the partition's ``SaverRecord`` as JSON: no QNN
context binary, so QNN's runtime cannot run it. Each delegate says so
(``edgeplug.plugin.STAND_IN_KEY`` in its ``_delegate_info_meta``, beside the
record), so the report's ``stand_in`` and ``notes`` say it and no ``.pte`` is
written under the requested name (``edgeplug lower --write-stand-in`` writes
``STEM.stand-in.pte``). The recorded API calls of each partition's graph are
under the saver folder: ``<method>-<n>.c``, beside the saver's own
``saver_output.c`` and ``params.bin``. That folder is ``EDGEPLUG_QNN_SAVER_DIR``
where it is set (kept), else one temporary folder per process, removed when
the process ends; the report names it either way.

The one patch of ExecuTorch internals is ``per_partition_saver`` (see there).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import json
import os
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from edgeplug.plugin import STAND_IN_KEY, Availability

MODE_VAR = "EDGEPLUG_QNN_SAVER"
DIR_VAR = "EDGEPLUG_QNN_SAVER_DIR"
SDK_VAR = "QNN_SDK_ROOT"
LIB_DIR = Path("lib") / "x86_64-linux-clang"
#: what the saver mode loads: the saver backend, and the system library ExecuTorch's adaptor opens
LIBRARIES = ("libQnnSaver.so", "libQnnSystem.so")
#: the first bytes of every delegate payload a saver lowering writes (no QNN context binary starts so)
PAYLOAD_MAGIC = b"EDGEPLUG-QNN-SAVER-STAND-IN\n"
#: how qnn_preprocess ends a saver compile: exit(<this> + the saver folder)
_SAVER_EXIT = "Record all QNN API calls from saver backend"


def enabled() -> bool:
    """Whether the saver mode is asked for (``EDGEPLUG_QNN_SAVER`` set to anything but ``""``/``0``)."""
    return os.environ.get(MODE_VAR, "").strip() not in ("", "0")


def not_a_folder(root: str) -> str:
    """What is wrong with a ``QNN_SDK_ROOT`` that is not a folder: it does not exist, or it is a file."""
    return "is a file, not the SDK's folder" if os.path.exists(root) else "does not exist"


def availability() -> Availability:
    """Whether the saver mode can run here; when not, what is missing and how to get it."""
    hint = (
        f"Lay out the QNN libraries under ${SDK_VAR}/{LIB_DIR.as_posix()} (the onnxruntime-qnn wheel holds "
        f"them: .ci/qnn_saver.sh shows how), put that folder on LD_LIBRARY_PATH before starting Python, "
        f"or unset {MODE_VAR}"
    )
    root = os.environ.get(SDK_VAR)
    if not root:
        return Availability(ok=False, reason=f"{MODE_VAR} is set but {SDK_VAR} is not", hint=hint)
    if not Path(root).is_dir():
        return Availability(ok=False, reason=f"{MODE_VAR} is set and {SDK_VAR}={root} {not_a_folder(root)}", hint=hint)
    lib_dir = Path(root) / LIB_DIR
    missing = [lib for lib in LIBRARIES if not (lib_dir / lib).is_file()]
    if missing:
        return Availability(ok=False, reason=f"{SDK_VAR}={root} has no {', '.join(LIB_DIR.as_posix() + '/' + m for m in missing)}", hint=hint)
    for lib in LIBRARIES:  # by name, as ExecuTorch's adaptor opens them: through LD_LIBRARY_PATH
        try:
            ctypes.CDLL(lib)
        except OSError as exc:
            return Availability(
                ok=False, hint=hint,
                reason=f"{lib} is in {lib_dir} but does not load by name, as ExecuTorch opens it ({exc})",
            )
        loaded = _loaded_from(lib)
        if loaded is not None and loaded.resolve() != (lib_dir / lib).resolve():
            return Availability(
                ok=False, hint=hint,
                reason=f"{lib} loads by name from {loaded.parent}, not from {lib_dir}: LD_LIBRARY_PATH names "
                f"another QNN library folder than {SDK_VAR}",
            )
    try:
        from edgeplug_qnn._executorch import ensure_qualcomm_importable

        ensure_qualcomm_importable()  # 1.4 downloads the QNN SDK at import: not here
        import executorch.backends.qualcomm.python.PyQnnManagerAdaptor  # noqa: F401
    except ImportError as exc:
        return Availability(
            ok=False, reason=f"ExecuTorch's QNN adaptor (PyQnnManagerAdaptor) does not import: {exc}",
            hint="Install an executorch wheel built with the QNN backend (executorch 1.5.1 on x86-64 Linux is)",
        )
    return Availability(ok=True)


def _loaded_from(lib: str) -> Optional[Path]:
    """Where this process loaded ``lib`` from (Linux's /proc/self/maps), or None if unknown."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    for line in maps:
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if path.endswith("/" + lib):
            return Path(path)
    return None


def compile_specs(soc: Any, out_dir: Optional[str] = None) -> list:
    """QNN compile specs for ``soc`` (a ``QcomChipset``) with the saver backend, recording under ``out_dir``."""
    from edgeplug_qnn._executorch import ensure_qualcomm_importable

    ensure_qualcomm_importable()  # 1.4 downloads the QNN SDK at import: not here
    from executorch.backends.qualcomm.serialization.qc_schema_serialize import (
        flatbuffer_to_option,
        option_to_flatbuffer,
    )
    from edgeplug_qnn._executorch import ensure_qualcomm_importable

    ensure_qualcomm_importable()  # 1.4 downloads the QNN SDK at import: not here
    from executorch.backends.qualcomm.utils.utils import (
        generate_htp_compiler_spec,
        generate_qnn_executorch_compiler_spec,
    )
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    out_dir = out_dir or _process_dir()
    (spec,) = generate_qnn_executorch_compiler_spec(
        soc_model=soc, backend_options=generate_htp_compiler_spec(use_fp16=True), saver=True
    )
    option = flatbuffer_to_option(spec.value)
    option.saver_output_dir = str(out_dir)  # upstream writes to ./saver_output, wherever Python runs
    return [CompileSpec(spec.key, option_to_flatbuffer(option))]


@dataclass
class SaverRecord:
    """What QNN's saver recorded for one partition."""

    method: str
    partition: int
    #: the file holding the QNN API calls recorded for this partition's graph (C source)
    calls_file: str
    #: QNN op type -> nodes of that type added to the partition's QNN graph (``{"RmsNorm": 5, ...}``)
    ops: dict[str, int] = field(default_factory=dict)
    #: QNN API calls recorded (graph creation, tensors, nodes, finalize, ...)
    api_calls: int = 0
    #: whether the graph was finalized (QNN's compile step, as the saver records it)
    finalized: bool = False

    @property
    def nodes(self) -> int:
        return sum(self.ops.values())

    def payload(self) -> bytes:
        """The stand-in delegate payload: the magic, then this record as JSON."""
        return PAYLOAD_MAGIC + json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_payload(cls, data: bytes) -> "SaverRecord":
        if not data.startswith(PAYLOAD_MAGIC):
            raise ValueError("not a QNN saver stand-in payload (it does not start with edgeplug's saver magic)")
        return cls(**json.loads(data[len(PAYLOAD_MAGIC):]))


_OP_CONFIG = re.compile(r'Qnn_OpConfigV1_t (\w+)_v1 = \{"[^"]*", "[^"]*", "(\w+)"')
_ADD_NODE = re.compile(r"interface\.graphAddNode\(\w+, (\w+)\)")
_API_CALL = re.compile(r"\binterface\.(\w+)\(")


def _process_dir() -> str:
    """The saver folder of this process: ``EDGEPLUG_QNN_SAVER_DIR``, or one temporary folder."""
    global _PROCESS_DIR
    if os.environ.get(DIR_VAR):  # asked for: kept
        os.makedirs(os.environ[DIR_VAR], exist_ok=True)
        return os.environ[DIR_VAR]
    if _PROCESS_DIR is None:
        _PROCESS_DIR = tempfile.mkdtemp(prefix="edgeplug-qnn-saver-")
        # nobody asked to keep it: no folder is left behind, one per run
        atexit.register(shutil.rmtree, _PROCESS_DIR, ignore_errors=True)
    return _PROCESS_DIR


def _stand_in_note(folder: Path, partitions: int) -> dict:
    """What each delegate says of itself to the core (``STAND_IN_KEY``): the report's ``stand_in``."""
    held = "the QNN delegate holds" if partitions == 1 else f"each of the {partitions} QNN delegates holds"
    return {
        "reason": f"QNN saver mode ({MODE_VAR}=1): {held} a stand-in payload (what QNN's saver recorded), "
        "not a context binary, so this program does not run",
        "folder": str(folder),
        "kept": bool(os.environ.get(DIR_VAR)),
        "keep_hint": f"set {DIR_VAR}=DIR to keep it",
    }


_PROCESS_DIR: Optional[str] = None
#: numbers the graphs recorded in this process (their copies in the saver folder)
_GRAPHS = itertools.count()
#: a QNN manager over the saver backend, kept for the life of the process (see _keep_saver_started)
_KEEPER: Optional[Any] = None


def _keep_saver_started(specs: list) -> None:
    """Start QNN's saver backend once and keep it started until the process ends.

    Once the saver has recorded a graph, it cannot be started again in the
    same process ("QnnSaver Backend Failed to saver_initialize. Error 4951"),
    and ExecuTorch frees the backend when the last QNN manager using it is
    destroyed (each lowering's QnnManagerContext destroys its own). While one
    manager holds it, later managers share the started backend, so lowering
    after lowering (and ExecuTorch's own flow in the same process) records.
    """
    global _KEEPER
    if _KEEPER is None:
        from edgeplug_qnn._executorch import ensure_qualcomm_importable

        ensure_qualcomm_importable()  # 1.4 downloads the QNN SDK at import: not here
        from executorch.backends.qualcomm.partition.utils import generate_qnn_executorch_option
        from executorch.backends.qualcomm.serialization.qc_schema_serialize import flatbuffer_to_option
        from executorch.backends.qualcomm.utils.qnn_manager_lifecycle import QnnManagerRegistry

        option = generate_qnn_executorch_option(specs)
        _KEEPER = QnnManagerRegistry().get_or_create_qnn_manager(
            flatbuffer_to_option(option).backend_options.backend_type, option
        )


def _graph_record(method: str, partition: int, folder: Path, copy_to: Path) -> SaverRecord:
    """The record of the graph QNN's saver recorded last in ``folder`` (copied to ``copy_to``)."""
    path = folder / "saver_output.c"
    if not path.is_file():
        raise RuntimeError(
            f"QNN's saver wrote no {path} for partition {partition} of method {method!r}: the saver backend "
            f"did not run (is {LIBRARIES[0]} the library the compile specs name?)"
        )
    text = path.read_text(errors="replace")
    if "interface.graphCreate(" not in text:
        raise RuntimeError(f"QNN's saver recorded no graph in {path} for partition {partition} of method {method!r}")
    # the saver's file holds every call since the backend started: this partition's graph is the last
    start = text.rindex("interface.graphCreate(")
    graph_text = text[start:]
    copy_to.write_text(graph_text)
    op_types = dict(_OP_CONFIG.findall(graph_text))
    calls = _API_CALL.findall(graph_text)
    ops = Counter(op_types.get(var, "?") for var in _ADD_NODE.findall(graph_text))
    return SaverRecord(
        method=method, partition=partition, calls_file=str(copy_to), ops=dict(sorted(ops.items())),
        api_calls=len(calls), finalized="graphFinalize" in calls,
    )


@contextlib.contextmanager
def per_partition_saver(specs: list) -> Iterator[list[SaverRecord]]:
    """While open, ``QnnBackend.preprocess_multimethod`` records each partition with QNN's saver.

    The patch, and why: with ``saver=True``, ExecuTorch 1.5.1's
    ``QnnBackend.preprocess_multimethod`` builds the first partition's QNN
    graph, then calls ``exit()`` (a ``SystemExit``), so a lowering with more
    than one partition never reaches the others, and none gets a payload.
    Here each partition is handed to the original method alone; the exit is
    caught (any other ``SystemExit`` is not), the graph the saver recorded is
    read into a ``SaverRecord``, and the partition gets the stand-in payload.
    The original is restored on exit, errors included.

    One QNN manager, made from ``specs`` (saver compile specs), serves the
    partitioner's op checks and every preprocess, as in ExecuTorch's own
    ``to_edge_transform_and_lower_to_qnn`` (see ``_keep_saver_started`` for
    why the saver backend itself stays started). Yields the list the records
    are appended to.
    """
    from edgeplug_qnn._executorch import ensure_qualcomm_importable

    ensure_qualcomm_importable()  # 1.4 downloads the QNN SDK at import: not here
    from executorch.backends.qualcomm.serialization.qc_schema_serialize import flatbuffer_to_option
    from executorch.backends.qualcomm.utils.qnn_manager_lifecycle import QnnManagerContext, get_current_qnn_manager

    from edgeplug_qnn._executorch import preprocess_multimethod_replaced, preprocess_result

    records: list[SaverRecord] = []

    def preprocess_multimethod(original: Any, edge_programs: dict, compile_specs: dict) -> dict:
        results: dict[str, list] = {}
        for method, programs in edge_programs.items():
            results[method] = []
            for i, program in enumerate(programs):
                spec_list = compile_specs[method][i]
                option = flatbuffer_to_option(spec_list[0].value)
                if not option.saver:
                    raise RuntimeError(
                        f"the QNN saver mode ({MODE_VAR}) got compile specs without saver=True for partition {i} of "
                        f"method {method!r}: it would be compiled for a device instead of recorded. Make the "
                        "partitioner with edgeplug_qnn.saver.compile_specs"
                    )
                try:
                    original({method: [program]}, {method: [spec_list]})
                except SystemExit as exc:  # qnn_preprocess's exit(...) after a saver compile: expected
                    if not str(exc.code).startswith(_SAVER_EXIT):
                        raise
                    # what upstream does after a compile, skipped by its exit: free the partition's context
                    get_current_qnn_manager(option.backend_options.backend_type, spec_list).DestroyContext()
                folder = Path(option.saver_output_dir)
                record = _graph_record(method, i, folder, folder / f"{method}-{next(_GRAPHS)}.c")
                records.append(record)
                results[method].append(record)
        count = sum(len(v) for v in results.values())
        return {
            method: [
                preprocess_result(
                    r.payload(), {**asdict(r), STAND_IN_KEY: _stand_in_note(Path(r.calls_file).parent, count)}
                )
                for r in recorded
            ]
            for method, recorded in results.items()
        }

    _keep_saver_started(specs)
    with QnnManagerContext({"forward": specs}), preprocess_multimethod_replaced(preprocess_multimethod):
        yield records


def lowered_records(edge_ep: Any) -> list[SaverRecord]:
    """The saver records of a lowered program's QNN delegates, in graph order."""
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    out = []
    for _name, lowered, _node in get_lowered_submodules(edge_ep.graph_module):
        if lowered.backend_id == "QnnBackend":
            out.append(SaverRecord.from_payload(bytes(lowered.processed_bytes)))
    return out
