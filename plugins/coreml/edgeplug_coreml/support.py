"""What the Core ML backend declares: its availability, partitioner, keep-whole table and dtype filter.

Nothing here imports coremltools or executorch at module level: importing
coremltools loads torch and logs a page of warnings on Linux, so it happens
only in the partitioner factory, inside ``quiet_coreml``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import sys
import warnings
from typing import TYPE_CHECKING, Any, Iterator, Optional

from edgeplug.plugin import Availability

if TYPE_CHECKING:  # the partition module imports executorch; plugins load without it
    from edgeplug.plugin import FilterContext

#: the coremltools release executorch 1.5.1 builds its Core ML programs with
COREMLTOOLS = "coremltools==9.0"
INSTALL = f"pip install {COREMLTOOLS}"
#: executorch's name for the delegate (the id a .pte's delegate carries)
BACKEND_ID = "CoreMLBackend"
DTYPE_FILTER = "coreml-dtypes"
SYMBOLIC_FILTER = "coreml-tensor-inputs"


def _coremltools_missing() -> Optional[str]:
    """Why coremltools cannot be imported, or None; finds it without importing it."""
    if "coremltools" in sys.modules and sys.modules["coremltools"] is None:
        return "coremltools is blocked in this interpreter (sys.modules['coremltools'] is None)"
    try:
        found = importlib.util.find_spec("coremltools")
    except (ImportError, ValueError) as exc:
        return f"coremltools cannot be found ({exc})"
    return None if found is not None else "coremltools is not installed"


def availability() -> Availability:
    """Available where coremltools is: it builds the .mlpackage the delegate stores."""
    missing = _coremltools_missing()
    if missing:
        return Availability(
            ok=False,
            reason=f"{missing}; executorch's Core ML delegate builds its programs with it",
            hint=f"{INSTALL} (it comes with executorch on macOS and Linux x86-64)",
        )
    return Availability(ok=True)


# -- Core ML's library noise -----------------------------------------------------------

#: loggers that print on import or conversion: coremltools' version checks and
#: "Failed to load _MLModelProxy" (no Core ML runtime off macOS), and executorch's
#: Core ML partitioner and preprocess, which set their own levels (so each is set here)
_NOISY_LOGGERS = ("coremltools", "executorch.backends.apple.coreml")


def _executorch_warnings_shown() -> bool:
    # the CLI quiets executorch's loggers unless -v; a Python caller decides the same way
    return logging.getLogger("executorch").isEnabledFor(logging.WARNING)


def _noisy_loggers() -> list[logging.Logger]:
    names = [n for n in list(logging.Logger.manager.loggerDict) if n.startswith(_NOISY_LOGGERS)]
    return [logging.getLogger(n) for n in {*_NOISY_LOGGERS, *names}]


class _ExecutorchRootWarnings(logging.Filter):
    """Drops what executorch logs on the root logger below ERROR.

    ``to_edge`` warns there once per op CoreMLPartitioner asks to keep whole
    that executorch then decomposes anyway (mul, add, div: "requested for
    preservation ... in a blocklist"), which is every Core ML lowering.
    """

    def __init__(self) -> None:
        super().__init__()
        import executorch

        self.roots = tuple(str(p) for p in executorch.__path__)

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or not record.pathname.startswith(self.roots)


def _quiet_bars() -> list[tuple[Any, str, Any]]:
    """Swap tqdm for a disabled tqdm in every loaded coremltools module; returns what to restore."""
    try:
        import tqdm
    except ImportError:
        return []

    class _NoBar(tqdm.tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    swapped = []
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("coremltools"):
            continue
        for attr, value in list(vars(module).items()):
            if value is tqdm.tqdm:
                swapped.append((module, attr, value))
                setattr(module, attr, _NoBar)
    return swapped


@contextlib.contextmanager
def quiet_coreml() -> Iterator[None]:
    """Keep coremltools' warnings, log lines and progress bars off the terminal.

    Shown as they are when executorch's warnings are (``edgeplug lower -v``, or a
    caller who configured logging so): Core ML's delegate is part of executorch.
    Everything changed is restored on exit, errors included.
    """
    if _executorch_warnings_shown():
        yield
        return
    loggers = _noisy_loggers()
    levels = [logger.level for logger in loggers]
    root_filter = _ExecutorchRootWarnings()
    swapped: list[tuple[Any, str, Any]] = []
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        logging.getLogger().addFilter(root_filter)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # bars of the coremltools modules loaded by now (the partitioner factory imported them)
            swapped = _quiet_bars()
            yield
    finally:
        for module, attr, value in swapped:
            setattr(module, attr, value)
        logging.getLogger().removeFilter(root_filter)
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


# -- what the backend takes ------------------------------------------------------------


def keep_whole_ops() -> tuple[Any, ...]:
    """Ops kept whole through to_edge besides those CoreMLPartitioner keeps itself.

    ``CoreMLPartitioner.ops_to_not_decompose`` keeps whole every op of the
    aten program coremltools converts (views and tril/triu/repeat_interleave
    excepted); the core merges this table with that list. ``aten.rms_norm``
    is here because the core's fusion creates it: it need not be in the
    program the user exported.
    """
    import torch

    return (torch.ops.aten.rms_norm.default,)


#: dtypes Core ML has no tensor type for (its programs compute in fp16/fp32)
LACKS = ("float64", "complex32", "complex64", "complex128")


def _tensor_values(node: Any) -> Iterator[tuple[str, Any]]:
    import torch

    def values(what: str, v: Any) -> Iterator[tuple[str, Any]]:
        if isinstance(v, torch.Tensor):
            yield what, v
        elif isinstance(v, (list, tuple)):
            for x in v:
                yield from values(what, x)

    yield from values("its output", node.meta.get("val"))
    for arg in node.all_input_nodes:
        yield from values(f"its input {arg.name}", arg.meta.get("val"))


def refuse_dtypes_coreml_lacks(node: Any, ctx: "FilterContext") -> Any:
    """Refuse a node that reads or writes a float64 or complex tensor: it stays on the CPU."""
    if node.op != "call_function":
        return None
    from edgeplug.plugin import refuse

    for what, value in _tensor_values(node):
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype in LACKS:
            return refuse(f"Core ML has no {dtype} tensors ({what} is {dtype}); cast the model to float32 to delegate it")
    return None


def _data_dependent_int(value: Any) -> bool:
    import torch
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)) and bool(free_unbacked_symbols(value))


def refuse_data_dependent_scalars(node: Any, ctx: "FilterContext") -> Any:
    """Refuse a node that makes a data-dependent integer (``input_pos[0].item()``) or reads a symbolic one.

    A Core ML program takes tensors only: a partition whose input is a symbolic
    integer (a dynamic size, a ``.item()``) fails in the delegate's preprocess
    ("Placeholder val must be a tensor"), so the node stays on the CPU with the
    integer it needs.
    """
    if node.op != "call_function":
        return None
    from edgeplug.plugin import refuse

    if _data_dependent_int(node.meta.get("val")):
        return refuse(f"Core ML programs take and give tensors only; {node.name} computes the data-dependent integer {node.meta['val']}")
    import torch

    for arg in node.all_input_nodes:
        val = arg.meta.get("val")
        if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return refuse(
                f"Core ML programs take tensors only; its input {arg.name} is the symbolic integer {val} "
                "computed on the CPU (a dynamic size or a .item())"
            )
    return None


def make_partitioner() -> Any:
    """ExecuTorch's CoreMLPartitioner, compiling for fp16 and iOS 18."""
    missing = _coremltools_missing()
    if missing:
        raise RuntimeError(f"the Core ML partitioner needs coremltools: {missing}; {INSTALL}")
    with quiet_coreml():  # coremltools logs its version checks and missing runtime on import
        import coremltools as ct
        from executorch.backends.apple.coreml.compiler import CoreMLBackend
        from executorch.backends.apple.coreml.partition import CoreMLPartitioner

    specs = CoreMLBackend.generate_compile_specs(
        compute_precision=ct.precision.FLOAT16,
        minimum_deployment_target=ct.target.iOS18,
    )
    return CoreMLPartitioner(compile_specs=specs)
