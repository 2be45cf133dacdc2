"""ExecuTorch's internals, in one place: the only core module that reaches past ExecuTorch's public API.

Everything else in the core meets ExecuTorch through its public API
(``to_edge_transform_and_lower``, ``Partitioner``, ``EdgeCompileConfig``, ...).
Where edgeplug needs more (a private module, a private attribute, or one of
ExecuTorch's functions replaced for the length of a lowering), it asks here, by
a named function that probes for the feature it needs, never for a version
number, and either adapts or raises ``ExecutorchVersionError`` naming what the
installed release lacks, what it is needed for, and the range edgeplug is
tested with. Each plugin keeps its own reaches in one module of its own
(``<package>/_executorch.py``); ``tests/test_executorch_boundary.py`` fails on a
reach anywhere else.

What each release lacks, as seen (the probes decide, not this table):

- 1.4: ``_cord.FileBackedData`` (serialized weights then stay in memory until
  the .pte is written instead of waiting in temporary files), the WebGPU
  partitioner, and ``copy`` inside ``backend_details`` (1.4 does not copy a
  partition's program before preprocess).
"""

from __future__ import annotations

import contextlib
import copy as copy_module
import functools
import importlib
import re
from importlib import metadata, resources
from typing import Any, Callable, Iterator, Optional

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from edgeplug._errors import ExecutorchVersionError

#: the ExecuTorch releases edgeplug is tested with (CI runs both ends: see the README's testing section)
TESTED_RANGE = ">=1.4,<1.6"


# -- versions -----------------------------------------------------------------------------------


def installed_version(dist: str) -> Optional[str]:
    """The installed version of a distribution, or None."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, Optional[str]]:
    """What edgeplug runs on: executorch, torch and torchao, as installed (None where absent)."""
    return {name: installed_version(name) for name in ("executorch", "torch", "torchao")}


def satisfies(version: Optional[str], specifier: str) -> bool:
    """Whether ``version`` is in ``specifier`` (a PEP 440 range); pre-releases count as their release."""
    if version is None:
        return False
    try:
        v = Version(version)
    except InvalidVersion:
        return False
    return SpecifierSet(specifier).contains(v, prereleases=True)


def in_tested_range(version: Optional[str] = None) -> bool:
    return satisfies(version if version is not None else installed_version("executorch"), TESTED_RANGE)


def range_warning() -> Optional[str]:
    """One line for a user outside the tested range (None inside it): they may still try."""
    version = installed_version("executorch")
    if version is None:
        return "executorch is not installed: edgeplug lowers nothing without it (pip install 'executorch" + TESTED_RANGE + "')"
    if in_tested_range(version):
        return None
    return (
        f"executorch {version} is outside the range edgeplug is tested with (executorch{TESTED_RANGE}): "
        "lowering may fail where that release changed ExecuTorch's internals; edgeplug names what it finds missing"
    )


def lacks(what: str, needed_for: str, since: Optional[str] = None) -> ExecutorchVersionError:
    """The error for a feature the installed ExecuTorch does not have."""
    version = installed_version("executorch") or "(not installed)"
    where = f"; it is in ExecuTorch {since} and later" if since else ""
    return ExecutorchVersionError(
        f"executorch {version} lacks {what}, which edgeplug needs for {needed_for}{where}; "
        f"edgeplug is tested with executorch{TESTED_RANGE}: install a release in that range"
    )


def probe(module: str, attr: Optional[str] = None) -> Any:
    """``module`` (or ``module.attr``) if the installed ExecuTorch has it, else None. Never raises for a
    missing feature; an import that fails for another reason (a dependency of that module missing) is
    returned as the exception, so the caller can name it."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == module or module.startswith(missing + "."):
            return None  # the module itself (or a package above it) is not in this release
        return exc
    except ImportError as exc:
        return exc
    if attr is None:
        return mod
    return getattr(mod, attr, None)


def require(module: str, attr: Optional[str] = None, *, needed_for: str, since: Optional[str] = None) -> Any:
    """``module`` (or ``module.attr``), or ``ExecutorchVersionError`` naming what is missing."""
    found = probe(module, attr)
    what = f"{attr} ({module})" if attr else module
    if found is None:
        raise lacks(what, needed_for, since)
    if isinstance(found, ImportError):
        dep = getattr(found, "name", None)
        hint = f": pip install {dep}" if dep else ""
        raise ExecutorchVersionError(
            f"{what}, which edgeplug needs for {needed_for}, does not import: {found}"
            f" (a package it needs is missing{hint})"
        ) from found
    return found


def executorch_feature(module: str, attr: Optional[str] = None, *, needed_for: str, since: Optional[str] = None) -> Any:
    """For plugins (``edgeplug.plugin.executorch_feature``): ``module`` (or ``module.attr``) if the installed
    ExecuTorch has it, else ``ExecutorchVersionError`` naming it, ``needed_for`` and the release ``since``."""
    return require(module, attr, needed_for=needed_for, since=since)


def executorch_has(module: str, attr: Optional[str] = None) -> bool:
    """For plugins (``edgeplug.plugin.executorch_has``): whether the installed ExecuTorch has ``module``
    (and ``attr``), importing it to see; never raises."""
    found = probe(module, attr)
    return found is not None and not isinstance(found, ImportError)


def lacks_executorch_feature(what: str, needed_for: str, since: Optional[str] = None) -> ExecutorchVersionError:
    """For a plugin's own probe of something it found missing: the error to raise."""
    return lacks(what, needed_for, since)


# -- the edge dialect ---------------------------------------------------------------------------


def edge_dialect_ops() -> Any:
    """ExecuTorch's edge-dialect op namespace: ``edge_dialect_ops().aten.add.Tensor``."""
    ops = require("executorch.exir.dialects._ops", "ops", needed_for="creating edge-dialect ops (fusion, rewrites)")
    return ops.edge


def inner_aten_op(target: Any) -> Any:
    """The aten ``OpOverload`` an edge op (``EdgeOpOverload``) wraps, or None for anything else."""
    return getattr(target, "_op", None)


@functools.lru_cache(maxsize=1)
def default_decompositions() -> dict:
    """The decomposition table ``to_edge`` applies to ops not kept whole."""
    table = require(
        "executorch.exir.tracer", "_default_decomposition_table",
        needed_for="telling which kept-whole ops to_edge would otherwise decompose",
    )
    return table()


def strict_edge_compile_config(allowed: list[Any]) -> Any:
    """``to_edge``'s config with ExecuTorch's strict IR check on, the aten ops in ``allowed`` let through
    (``EdgeCompileConfig._core_aten_ops_exception_list``: underscored, though the verifier's own message names it)."""
    from executorch.exir import EdgeCompileConfig  # executorch: loaded by a lowering, not by import edgeplug

    fields = getattr(EdgeCompileConfig, "__dataclass_fields__", {})
    if "_core_aten_ops_exception_list" not in fields:
        raise lacks("EdgeCompileConfig._core_aten_ops_exception_list",
                    "letting a model's own ops outside core ATen through edgeplug's strict IR check")
    return EdgeCompileConfig(_check_ir_validity=True, _core_aten_ops_exception_list=list(allowed))


#: where ExecuTorch lists its portable kernels (the op names of their out variants), inside the executorch package
PORTABLE_KERNELS = ("kernels", "portable", "functions.yaml")


@functools.lru_cache(maxsize=1)
def portable_kernel_ops() -> Optional[frozenset[str]]:
    """The ops ExecuTorch's portable kernel library implements, as ``"name.overload"`` of each out variant
    (``"round.out"``), from the ``kernels/portable/functions.yaml`` the executorch wheel ships (a data file,
    not an API); None where the installed release ships none (the caller then refuses nothing)."""
    try:
        path = resources.files("executorch")
        for part in PORTABLE_KERNELS:  # one part at a time: executorch is a namespace package
            path = path / part
        text = path.read_text()
    except (FileNotFoundError, ModuleNotFoundError, NotADirectoryError, OSError):
        return None
    return frozenset(re.findall(r"^- op: (\S+)", text, re.M))


def delegate_info(lowered: Any) -> Any:
    """What a delegate's preprocess returned as delegate info (``PreprocessResult._delegate_info_meta``)."""
    return lowered.meta.get("_delegate_info_meta") if isinstance(getattr(lowered, "meta", None), dict) else None


# -- the serialized program ---------------------------------------------------------------------


def deserialize(pte: bytes) -> Any:
    """A ``.pte`` read back into ExecuTorch's program schema (``.execution_plan``, ``.constant_buffer``...)."""
    fn = require(
        "executorch.exir._serialize._program", "deserialize_pte_binary", needed_for="reading a .pte back (delegate ids)"
    )
    return fn(pte).program


def pte_delegate_ids(pte: bytes) -> set[str]:
    """The delegate ids (``BackendDetails.id``, e.g. ``"XnnpackBackend"``) a serialized ``.pte`` names."""
    program = deserialize(pte)
    return {d.id for plan in program.execution_plan for d in plan.delegates}


def serialized_pieces(program: Any) -> tuple[Any, Optional[dict]]:
    """An ``ExecutorchProgramManager``'s serialized .pte and data files, as the pieces it keeps (a ``Cord``
    streaming weights from temporary files, and tag -> ``Cord``), without joining them into bytes; ``(None,
    None)`` where the manager keeps no such pieces (then use its public ``buffer`` / ``write_to_file``)."""
    getter = getattr(program, "_get_pte_data", None)
    # 1.5.1 keeps them as attributes, filled by to_executorch (no getter): a release that keeps neither
    # answers (None, None)
    pte = getter() if getter is not None else getattr(program, "_pte_data", None)
    return pte, getattr(program, "_tensor_data", None)


# -- ExecuTorch's runtime (Python bindings) -----------------------------------------------------


def _portable_lib() -> Any:
    return require(
        "executorch.extension.pybindings.portable_lib", needed_for="running a .pte on this host (verification)"
    )


def runtime_backends() -> Optional[frozenset[str]]:
    """The delegate backends (``BackendDetails`` ids) ExecuTorch's Python runtime links, or None where this
    release (or a runtime that does not import) cannot say."""
    lib = probe("executorch.extension.pybindings.portable_lib")
    names = getattr(lib, "_get_registered_backend_names", None) if lib is not None and not isinstance(lib, ImportError) else None
    try:
        return frozenset(str(n) for n in names()) if names is not None else None
    except Exception:  # a binding that cannot answer: nothing is known
        return None


def load_pte(pte: bytes, data: Optional[bytes] = None) -> Any:
    """A ``.pte`` (and its ``.ptd`` bytes) loaded in ExecuTorch's runtime; ``.forward(list)`` runs it.

    ExecuTorch's public ``Runtime.load_program`` takes a .ptd only as a path (1.5) or not at all (1.4); the
    bindings' loader takes both as bytes, which the runtime reads in place: keep ``data`` referenced."""
    lib = _portable_lib()
    loader = getattr(lib, "_load_for_executorch_from_buffer", None)
    if loader is None:
        raise lacks("_load_for_executorch_from_buffer (its Python runtime bindings)", "running a .pte on this host")
    return loader(pte, data) if data is not None else loader(pte)


def set_runtime_threads(n: int) -> None:
    """The runtime's thread pool, reset to ``n`` threads (benchmarks time a program, not the machine)."""
    reset = getattr(_portable_lib(), "_unsafe_reset_threadpool", None)
    if reset is None:
        raise lacks("_unsafe_reset_threadpool (its Python runtime bindings)", "timing a .pte on one thread")
    reset(n)


# -- how a lowering holds its weights (edgeplug._weights decides what; this is how) -------------


def file_backed_data() -> Optional[type]:
    """ExecuTorch's ``FileBackedData`` (serialized bytes a serializer streams from a file), or None where the
    release has none (1.4): then weights stay in memory until the .pte is written."""
    cls = probe("executorch.exir._serialize._cord", "FileBackedData")
    return cls if isinstance(cls, type) else None


@contextlib.contextmanager
def deepcopy_in_to_backend(deepcopy: Callable[[Any, Any], Any]) -> Iterator[int]:
    """Inside: ExecuTorch's ``to_backend`` (and ``BackendDetails.copy_exported_program_for_preprocess``, where
    the release has it) copy programs with ``deepcopy``. Yields how many of those modules were reached (0: the
    release copies some other way, and the default copy stands)."""
    class _Copy:
        def __getattr__(self, name: str) -> Any:
            return getattr(copy_module, name)

        @staticmethod
        def deepcopy(x: Any, memo: Any = None) -> Any:
            return deepcopy(x, memo)

    modules = [
        m for m in (probe("executorch.exir.backend.backend_api"), probe("executorch.exir.backend.backend_details"))
        if m is not None and not isinstance(m, ImportError) and getattr(m, "copy", None) is copy_module
    ]
    for m in modules:
        m.copy = _Copy()
    try:
        yield len(modules)
    finally:
        for m in modules:
            m.copy = copy_module


@contextlib.contextmanager
def serialized_weights_intercepted(
    named_data: Callable[[Any, Any], tuple[Any, Any]], constant: Callable[[Any, Any], Any]
) -> Iterator[None]:
    """Inside: every weight ExecuTorch serializes passes through edgeplug first.

    - ``named_data(data, external_tag) -> (data, external_tag)``: each ``NamedDataStore.add_named_data`` (a
      delegate's preprocess storing a weight, ``to_executorch`` merging the delegates' stores);
    - ``constant(buffer_data, allocation_info) -> buffer_data``: each constant the emitter serializes for the
      CPU (``_Emitter._save_new_const_tensor``).
    """
    store = require(
        "executorch.exir._serialize._named_data_store", "NamedDataStore", needed_for="external weights and spilling"
    )
    emitter = require("executorch.exir.emit._emitter", "_Emitter", needed_for="spilling serialized weights")
    original_add = store.add_named_data
    original_save = emitter._save_new_const_tensor

    def add_named_data(self: Any, key: str, data: Any, alignment: Any = 1, external_tag: Any = None, **kw: Any) -> None:
        data, external_tag = named_data(data, external_tag)
        original_add(self, key, data, alignment, external_tag, **kw)

    def save_new_const_tensor(
        self: Any, spec: Any, buffer_data: Any, hashed: str, allocation_info: Any = None, constant_tag: Any = None
    ) -> Any:
        buffer_data = constant(buffer_data, allocation_info)
        return original_save(self, spec, buffer_data, hashed, allocation_info, constant_tag)

    store.add_named_data = add_named_data
    emitter._save_new_const_tensor = save_new_const_tensor
    try:
        yield
    finally:
        store.add_named_data = original_add
        emitter._save_new_const_tensor = original_save


# -- a failure caused by a missing ExecuTorch internal is never "a bug in edgeplug" -------------


def version_gap(exc: BaseException) -> Optional[str]:
    """What the installed ExecuTorch lacks, as a sentence, when ``exc`` (or its cause) is an import of an
    ExecuTorch module or name that this release does not have (or a package one of its modules needs);
    None for any other failure."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ImportError):
            said = _import_gap(exc)
            if said:
                return said
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


def _import_gap(exc: ImportError) -> Optional[str]:
    version = installed_version("executorch") or "(not installed)"
    tested = f"edgeplug is tested with executorch{TESTED_RANGE}"
    text = str(exc)
    module = exc.name or ""
    if isinstance(exc, ModuleNotFoundError) and module.startswith("executorch"):
        return f"executorch {version} has no module {module}; {tested}"
    cannot = re.match(r"cannot import name '([^']+)' from '([^']+)'", text)
    if cannot and cannot.group(2).startswith("executorch"):
        return f"executorch {version} lacks {cannot.group(1)} (in {cannot.group(2)}); {tested}"
    if isinstance(exc, ModuleNotFoundError) and module and exc.__traceback__ is not None:
        frames = [f for f in _traceback_modules(exc) if f.startswith("executorch")]
        if frames:
            return (
                f"executorch's {frames[-1]} needs the package that provides the module {module!r}, which is not "
                f"installed (executorch {version} does not declare it): install it (pip install {_pip_name(module)})"
            )
    return None


def _traceback_modules(exc: BaseException) -> list[str]:
    tb, out = exc.__traceback__, []
    while tb is not None:
        out.append(tb.tb_frame.f_globals.get("__name__", "") or "")
        tb = tb.tb_next
    return out


def _pip_name(module: str) -> str:
    """The distribution that provides an import name, where the two differ (known cases), else the name."""
    return {"cpuinfo": "py-cpuinfo", "yaml": "pyyaml", "google": "protobuf"}.get(module.split(".")[0], module.split(".")[0])
