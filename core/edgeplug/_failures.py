"""Saying who is at fault when a lowering stage fails: a plugin, executorch, torch, the model, or edgeplug.

``stage_failure(exc, stage, backend)`` turns any exception into one
``LoweringError`` whose first line names the stage, the party at fault (found
by walking the traceback: the innermost frame that belongs to one of the
backend's plugins, or to executorch, with the executorch pass that was
running, if any) and the first line of the original cause. The original
exception stays chained as ``__cause__`` for ``--debug``.
"""

from __future__ import annotations

import inspect
import linecache
import os
import re
import sys
import sysconfig
import traceback
from types import FrameType, TracebackType
from typing import Any, Iterator, Optional

from edgeplug._errors import BackendUnavailableError, EdgeplugError, LoweringError
from edgeplug._executorch import version_gap

#: top-level packages that are never "the plugin at fault"
_LIBRARIES = {"edgeplug", "torch", "executorch", "torchao", "pydantic", "pluggy", "functools", "contextlib", "importlib"}


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def root_cause(exc: BaseException) -> BaseException:
    """The innermost exception of ``exc``'s chain (``__cause__``, else ``__context__``)."""
    seen = {id(exc)}
    while True:
        nxt = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if nxt is None or id(nxt) in seen:
            return exc
        seen.add(id(nxt))
        exc = nxt


def edgeplug_cause(exc: BaseException) -> Optional[EdgeplugError]:
    """The outermost ``EdgeplugError`` in ``exc``'s chain of causes, if any."""
    seen = set()
    cur: Optional[BaseException] = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, EdgeplugError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _frames(exc: BaseException) -> Iterator[FrameType]:
    """Frames of every exception in the chain, innermost first."""
    chain = []
    cur: Optional[BaseException] = exc
    seen = set()
    while cur is not None and id(cur) not in seen:
        chain.append(cur)
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    for e in reversed(chain):
        tbs: list[TracebackType] = []
        tb = e.__traceback__
        while tb is not None:
            tbs.append(tb)
            tb = tb.tb_next
        for t in reversed(tbs):
            yield t.tb_frame


def _module_of(fn: Any) -> Optional[str]:
    fn = getattr(fn, "__func__", fn)
    mod = getattr(fn, "__module__", None)
    if mod is None and callable(fn):
        mod = type(fn).__module__
    return mod


def plugin_modules(backend: Any) -> dict[str, Any]:
    """Top-level module/package name -> PluginInfo, for the code each of ``backend``'s plugins contributed."""
    out: dict[str, Any] = {}

    def add(fn: Any, info: Any) -> None:
        mod = _module_of(fn)
        if not mod or info is None:
            return
        top = mod.split(".")[0]
        if top not in _LIBRARIES:
            out.setdefault(top, info)

    spec = backend.spec
    for attr in ("partitioner", "availability", "lowering_context"):
        add(getattr(spec, attr, None), backend.plugin)
    for group, attrs in (("passes", ("fn",)), ("kernels", ("impl", "checks")), ("filters", ("fn",))):
        for rec in getattr(backend, group, ()):
            for attr in attrs:
                add(getattr(rec, attr, None), backend.origin(rec))
    # the backend's delegate (the BackendDetails its partitions are tagged for), where a package outside the
    # libraries holds it (a vendor's): an error its preprocess raises is the backend's, not unknown code's
    for details in _delegates_named(getattr(spec, "backend_id", "")):
        add(details, backend.plugin)
    ep = getattr(backend.plugin, "entry_point", "")
    if "=" in ep:
        top = ep.split("=", 1)[1].strip().split(".")[0].split(":")[0]
        if top and top not in _LIBRARIES:
            out.setdefault(top, backend.plugin)
    return out


def _delegates_named(backend_id: str) -> list[type]:
    """The loaded ``BackendDetails`` subclasses named ``backend_id`` (none where executorch is not loaded)."""
    base = getattr(sys.modules.get("executorch.exir.backend.backend_details"), "BackendDetails", None)
    if base is None or not backend_id:
        return []
    found, todo = [], list(base.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__name__ == backend_id:
            found.append(cls)
    return found


def _executorch_pass(frame: FrameType) -> Optional[str]:
    owner = frame.f_locals.get("self")
    if owner is None:
        return None
    cls = type(owner)
    if not cls.__module__.startswith("executorch."):
        return None
    names = [c.__name__ for c in inspect.getmro(cls)]
    if cls.__name__.endswith("Pass") or any(n in ("PassBase", "ExportPass", "ExportedProgramPassBase") for n in names):
        return f"{cls.__name__} ({cls.__module__})"
    return None


#: how executorch's pass managers wrap a pass's error
_PASS_MANAGER = re.compile(r"running the '([^']+)' pass")


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: Optional[BaseException] = exc
    while cur is not None and all(cur is not e for e in out):
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def executorch_pass_manager_error(exc: BaseException) -> Optional[tuple[str, BaseException]]:
    """(pass name, the wrapping exception) when executorch's pass manager reported a pass's failure."""
    for e in _chain(exc):
        m = _PASS_MANAGER.search(str(e))
        if m and any((f.f_globals.get("__name__") or "").startswith("executorch.") for f in _frames_of(e)):
            return m.group(1), e
    return None


def _frames_of(e: BaseException) -> Iterator[FrameType]:
    tb = e.__traceback__
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def at_fault(exc: BaseException, backend: Any = None) -> str:
    """Who is at fault, as a phrase: "plugin 'x' (...)", "executorch's pass P (module)", ..."""
    plugins = plugin_modules(backend) if backend is not None else {}
    wrapped = executorch_pass_manager_error(exc)
    if wrapped is not None and not any(
        (f.f_globals.get("__name__") or "").split(".")[0] in plugins for f in _frames(exc)
    ):
        return f"executorch's pass {wrapped[0]}"
    executorch_where: Optional[str] = None
    for frame in _frames(root_cause(exc)) if root_cause(exc).__traceback__ else _frames(exc):
        mod = frame.f_globals.get("__name__", "") or ""
        top = mod.split(".")[0]
        if top in plugins:  # the innermost frame of the plugin's code: its file and line
            return f"{plugins[top].describe()} at {frame.f_code.co_filename}:{frame.f_lineno}"
        if top == "executorch":
            found = _executorch_pass(frame)
            if found:
                return f"executorch's pass {found}"
            if executorch_where is None and frame.f_code.co_name not in ("_", "wrapper", "<lambda>"):
                owner = frame.f_locals.get("self")
                qual = f"{type(owner).__name__}.{frame.f_code.co_name}" if owner is not None else frame.f_code.co_name
                executorch_where = f"{qual} ({mod})"
        if top == "edgeplug" and executorch_where is None:
            return "edgeplug itself"
        if mod.startswith("_edgeplug_user_"):
            return "the model"
    for frame in _frames(exc):  # an executorch pass further out (e.g. running the failing helper)
        mod = frame.f_globals.get("__name__", "") or ""
        if mod.startswith("executorch."):
            found = _executorch_pass(frame)
            if found:
                return f"executorch's pass {found}"
    if executorch_where is not None:
        return f"executorch's {executorch_where}"
    return "torch" if any((f.f_globals.get("__name__") or "").startswith("torch") for f in _frames(exc)) else "unknown code"


def created_op_refused(exc: BaseException, created: Optional[dict[str, str]]) -> Optional[tuple[str, str]]:
    """``(op, who created it)`` when ``exc`` refuses an op that edgeplug or a plugin brought into the
    program (``created``: op name -> creator, as ``run_passes`` collects it), else None."""
    if not created:
        return None
    text = " ".join(str(e) for e in _chain(exc))
    for op in sorted(created, key=len, reverse=True):
        if re.search(re.escape(op) + r"(?![\w])", text):
            return op, created[op]
    return None


# -- the user's own mistakes ------------------------------------------------------------


def _library_roots() -> tuple[str, ...]:
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in sysconfig.get_paths()}
    for mod in ("torch", "executorch", "edgeplug", "torchao"):
        m = sys.modules.get(mod)
        if m is not None and getattr(m, "__file__", None):
            roots.add(os.path.dirname(os.path.dirname(os.path.abspath(m.__file__))))
    return tuple(os.path.join(r, "") for r in roots if r)


def _is_user_file(filename: str) -> bool:
    """A real source file outside the standard library, site-packages and the libraries edgeplug drives."""
    if not filename or filename.startswith("<") or not os.path.isfile(filename):
        return False
    path = os.path.abspath(filename)
    return not path.startswith(_library_roots())


def user_frame(exc: BaseException) -> Optional[tuple[str, int, str]]:
    """``(file, line, function)`` of the innermost frame in the user's own code (the model file or a sibling)."""
    for e in _chain(exc):
        found = None
        tb = e.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            module = tb.tb_frame.f_globals.get("__name__") or ""
            if _is_user_file(code.co_filename) and not module.startswith("edgeplug"):  # plugins: edgeplug_*
                found = (code.co_filename, tb.tb_lineno, code.co_qualname if hasattr(code, "co_qualname") else code.co_name)
            tb = tb.tb_next
        if found is not None:
            return found
    return None


def _where(frame: Optional[tuple[str, int, str]]) -> str:
    if frame is None:
        return ""

    file, line, func = frame
    text = linecache.getline(file, line).strip()
    return f" at {os.path.relpath(file) if not os.path.relpath(file).startswith('..') else file}:{line}, in {func}" + (
        f" (`{text}`)" if text else ""
    )


_UNKNOWN_OUTPUT = re.compile(r"Found <class '([^']+)'> in output, which is not a known type")
#: batch norms that update running statistics: what a BatchNorm in training mode exports to
_TRAIN_MODE_OPS = ("_native_batch_norm_legit_functional", "_native_batch_norm_legit.default")


def _class_location(dotted: str) -> str:
    module, _, name = dotted.rpartition(".")
    cls = getattr(sys.modules.get(module), name, None)
    if cls is None:
        return ""
    try:
        file = inspect.getsourcefile(cls)
        _, line = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return ""
    return f" (defined at {os.path.relpath(file) if file and not os.path.relpath(file).startswith('..') else file}:{line})"


def _node_line(exc: BaseException) -> str:
    """The model's source line of the graph node a failing check was looking at, from its stack trace."""
    import torch.fx  # torch: the CLI's startup imports this module

    for frame in _frames(exc):
        node = frame.f_locals.get("node")
        if isinstance(node, torch.fx.Node):
            trace = node.meta.get("stack_trace") or ""
            found = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', trace)
            user = [f for f in found if _is_user_file(f[0])]
            if user:
                file, line, func = user[-1]
                return _where((file, int(line), func))
    return ""


def user_mistake(exc: BaseException) -> Optional[tuple[str, str]]:
    """``(what, fix)`` when ``exc`` comes from a mistake in the user's model torch.export or to_edge refuses.

    Data-dependent control flow, an output type torch cannot flatten, a module
    left in training mode: each names the place in the user's code and the fix.
    """
    cause = root_cause(exc)
    text = "\n".join(str(e) for e in _chain(exc))
    kind = type(cause).__name__
    if kind in ("GuardOnDataDependentSymNode", "DataDependentOutputException") or "data-dependent expression" in text:
        return (
            f"the model branches on a tensor's value{_where(user_frame(exc))}, which torch.export cannot trace "
            f"({first_line(cause).rstrip('. ')})",
            "compute both sides and choose with torch.where, or write the branch with torch.cond; a branch on a "
            "shape or a Python value traces",
        )
    m = _UNKNOWN_OUTPUT.search(text)
    if m:
        dotted = m.group(1)
        name = dotted.rpartition(".")[2]
        return (
            f"the model returns a {name}{_class_location(dotted)}{_where(user_frame(exc))}, a type torch.export "
            "cannot flatten into tensors",
            f"register it before lowering (torch.export.register_dataclass({name}) for a dataclass, "
            "torch.utils._pytree.register_pytree_node otherwise), or return a tuple or dict of tensors",
        )
    if any(op in text for op in _TRAIN_MODE_OPS):
        return (
            f"the model holds a BatchNorm in training mode{_node_line(exc)}: its forward updates running "
            "statistics (aten._native_batch_norm_legit_functional), which no inference program computes",
            "call model.eval() before lowering",
        )
    return None


#: dropouts as torch.export records them: ``(input, p, train)``
_DROPOUT_OPS = ("dropout", "native_dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout")


def train_mode_dropout(ep: Any) -> Optional[str]:
    """Where ``ep`` drops out at random (a dropout exported with ``train=True`` and ``p > 0``): the module and
    the model's line, as a phrase ("Dropout 'drop' at model.py:12, in forward"), or None."""
    for node in ep.graph.nodes:
        if node.op != "call_function" or getattr(node.target, "_opname", None) not in _DROPOUT_OPS:
            continue
        args = list(node.args) + [None] * 3
        train, p = args[2], args[1]
        if train is not True or not isinstance(p, (int, float)) or p <= 0:
            continue
        stack = node.meta.get("nn_module_stack") or {}
        path, kind = next(reversed(stack.values()), ("", ""))
        kind = getattr(kind, "__name__", str(kind)).rpartition(".")[2] or "dropout"
        found = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', node.meta.get("stack_trace") or "")
        user = [f for f in found if _is_user_file(f[0])]
        where = _where((user[-1][0], int(user[-1][1]), user[-1][2])) if user else ""
        what = f"{kind} {path!r}" if path and "dropout" in kind.lower() else f"a dropout (p={p})"
        return f"{what}{where}"
    return None


def stage_failure(exc: BaseException, stage: str, backend: Any, created: Optional[dict[str, str]] = None) -> LoweringError:
    """One ``LoweringError``: stage, backend, who is at fault, and the cause's first line.

    Where the failure refuses an op that a transform created (``created``), the
    transform is at fault, whichever library's check found it.
    """
    cause = first_line(root_cause(exc)).rstrip(". ")
    gap = version_gap(exc)
    if gap is not None:
        err = LoweringError(f"stage {stage!r} failed for backend {backend.name!r}: {gap}. Nothing was written")
        err.lowering_stage = stage
        err.at_fault = "the installed executorch"
        return err
    made = created_op_refused(exc, created)
    if made is not None:
        op, who = made
        err = LoweringError(
            f"stage {stage!r} failed for backend {backend.name!r}: {cause}. The refused op {op} was not in "
            f"the model: {who} created it. The check that refused it is right to; the transform must create "
            "only ops valid where they land (an aten op that is not core ATen only before to_edge, kept whole "
            "by the backend's partitioner). Report it to whoever maintains that transform; --debug shows the traceback"
        )
        err.lowering_stage = stage
        err.at_fault = who
        return err
    mistake = user_mistake(exc)
    if mistake is not None:
        what, fix = mistake
        err = LoweringError(f"stage {stage!r} failed for backend {backend.name!r} in the model: {what}. Fix: {fix}")
        err.lowering_stage = stage
        err.at_fault = "the model"
        return err
    if any(type(e).__name__ == "SpecViolationError" for e in _chain(exc)):
        return _ir_check_failure(cause, stage, backend)
    who = at_fault(exc, backend)
    outer = first_line(exc)
    if outer.rstrip(". ") != cause and not who.startswith("executorch's pass"):
        cause = f"{cause} (raised as {outer})"
    msg = f"stage {stage!r} failed for backend {backend.name!r} in {who}: {cause}"
    if who.startswith("executorch"):
        msg += (
            ". This error is executorch's own, not edgeplug's or a plugin's (report it to ExecuTorch with the model); "
            "run with --debug for its traceback"
        )
    elif who.startswith("plugin"):
        msg += ". This is a bug in the plugin; report it to its maintainers"
    elif who == "edgeplug itself":
        msg += ". This is a bug in edgeplug; please report it with the traceback --debug prints"
    err = LoweringError(msg)
    err.lowering_stage = stage
    err.at_fault = who
    return err


def _ir_check_failure(cause: str, stage: str, backend: Any) -> LoweringError:
    """ExecuTorch's IR verifier refused an op no transform is known to have created. edgeplug runs the verifier
    where ExecuTorch's own flows do not (``edgeplug._graph.ir_check``), so the refusal is edgeplug's to answer for."""
    err = LoweringError(
        f"stage {stage!r} failed for backend {backend.name!r} in edgeplug's strict IR check: {cause}. edgeplug runs "
        "ExecuTorch's IR verifier on every lowering (EdgeCompileConfig(_check_ir_validity=True); ExecuTorch's own "
        "flows turn it off) and lets the model's own ops outside core ATen through; this op reached it another "
        "way (a decomposition, or a transform that did not say it made it). That is edgeplug's to fix, not "
        "ExecuTorch's: please report it to edgeplug with the model and the traceback --debug prints"
    )
    err.lowering_stage = stage
    err.at_fault = "edgeplug's strict IR check"
    return err


def name_the_plugin(exc: EdgeplugError, backend: Any) -> EdgeplugError:
    """Put the plugin at fault (found in ``exc``'s traceback) at the front of an edgeplug error that lacks it.

    A ``BackendUnavailableError`` is left as it is: a plugin raising it says the environment is at fault
    (an SDK present that cannot make its device), and its message names what to do."""
    if isinstance(exc, BackendUnavailableError):
        exc.at_fault = "the environment"
        return exc
    who = at_fault(exc, backend)
    named = who.rsplit(" at ", 1)[0]  # the plugin without its file and line
    if who.startswith("plugin ") and named not in str(exc) and exc.args and isinstance(exc.args[0], str):
        exc.args = (f"{who}: {exc.args[0]}", *exc.args[1:])
        exc.at_fault = who
    return exc


def format_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


__all__ = ["train_mode_dropout", "user_frame", "user_mistake", "name_the_plugin", "at_fault", "edgeplug_cause", "first_line", "format_traceback", "plugin_modules", "root_cause", "stage_failure"]
