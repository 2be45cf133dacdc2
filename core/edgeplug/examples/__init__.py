"""Built-in example models: what ``edgeplug lower NAME`` builds.

NAME is a registry name (``edgeplug._models.MODELS``: ``handwritten-llama-decoder``, ``transformers-qwen3``,
...) or a short name of a hand-written model (``gemma-block``, ``mlp``; ``llama``, deprecated in the
command line: ``edgeplug zoo``'s ``llama`` is another model, ``edgeplug._api.RENAMES``).

Each example is a callable returning ``(model, args)``: the same contract as
``edgeplug lower FILE.py:ATTR``, whose function may also return
``(model, args, kwargs)`` (keyword inputs, as ``edgeplug.lower`` takes them). Everything is built in code and
seeded; nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from edgeplug._api import model_renames
from edgeplug._errors import EdgeplugError
from edgeplug._failures import user_frame
from edgeplug._models import EXAMPLE_NAMES, MODELS
from edgeplug._user_code import Effects, _location, contained, returned_at

ExampleFn = Callable[[], tuple[Any, tuple[Any, ...]]]


#: ``edgeplug lower NAME``'s short names for the registry's hand-written models (``edgeplug._models``, whose
#: names say what each is: ``llama`` is ``handwritten-llama-decoder``): name -> (build, description)
EXAMPLES: dict[str, tuple[ExampleFn, str]] = {
    public: (MODELS[name].build, MODELS[name].what) for public, name in EXAMPLE_NAMES.items()
}


def list_examples() -> dict[str, str]:
    return {k: d for k, (_, d) in EXAMPLES.items()}


def registry_name(spec: str) -> Optional[str]:
    """The registry model (``edgeplug._models.MODELS``) that ``edgeplug lower SPEC`` builds: a short name's
    (``mlp`` is ``handwritten-mlp``) or a registry name itself; None for neither."""
    return EXAMPLE_NAMES.get(spec) or (spec if spec in MODELS else None)


def _check_contract(result: Any, spec: str, fn: Any = None) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """``(model, args)`` or ``(model, args, kwargs)``: a module (or ExportedProgram) and its example inputs.
    ``fn``: the model file's function, whose line the messages name."""
    # torch: the CLI's startup imports this module; a model being loaded pays for it
    import torch

    from edgeplug._inputs import example_inputs

    at = returned_at(fn) if fn is not None else ""
    paren = f" ({at})" if at else ""
    at = f" at {at}" if at else ""
    expected = "expected a tuple (model, args) or (model, args, kwargs)"
    if not (isinstance(result, tuple) and len(result) in (2, 3)):
        size = f" of {len(result)} items" if isinstance(result, tuple) else ""
        raise EdgeplugError(f"{spec} returned {type(result).__name__}{size}, {expected}{paren}")
    model, args, kwargs = (*result, None) if len(result) == 2 else result
    if not isinstance(model, (torch.nn.Module, torch.export.ExportedProgram)):
        raise EdgeplugError(
            f"{spec} returned a model of type {type(model).__name__}, {expected} "
            f"whose model is a torch.nn.Module{paren}"
        )
    where = f"{spec}'s return value (model, args, kwargs){at}"
    if isinstance(args, list) and args and all(isinstance(a, (tuple, list)) for a in args):
        # the shape of calibration data (a list of input sets), not one set of inputs
        raise EdgeplugError(
            f"{where}: args is a list of {len(args)} tuple(s), a list of input sets (what --calibration "
            "takes), but args is one set: the model's positional inputs. Return (model, (x,)) (the first set: "
            "args[0]); a model that takes a tuple as its one input gets it inside a tuple: (model, ((a, b),))"
        )
    given = example_inputs(args, kwargs, where=where)
    return model, given.args, given.kwargs


def _describe_exit(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        frame = user_frame(exc)  # the line that called it (the file's own, or a sibling's)
        where = f" at {_location(*frame)}" if frame else ""
        return f"it called sys.exit({exc.code!r}){where}; a model file must return (model, args), not exit"
    return f"{type(exc).__name__}: {exc}"


def import_user_file(
    spec: str,
    what: str,
    *,
    error: type[Exception] = EdgeplugError,
    progress: Optional[Callable[[str], None]] = None,
    then: str = "",
) -> tuple[Any, str, str]:
    """Execute the file of ``FILE.py:ATTR`` as ``python FILE.py`` would; returns ``(module, ATTR, FILE.py)``.

    The file's folder goes on ``sys.path`` (sibling imports work); a failed
    import, ``sys.exit()`` included, raises ``error`` naming the file and
    leaves no half-imported module behind. ``what`` names the file in
    messages ("model file", "calibration file").
    """
    path_s, attr = spec.rsplit(":", 1)
    path = Path(path_s)
    if not path.is_file():
        raise error(f"{what} {path_s!r} does not exist")
    mod_name = "_edgeplug_user_" + ("" if what == "model file" else what.split()[0] + "_") + path.stem
    loader = importlib.util.spec_from_file_location(mod_name, path)
    if loader is None or loader.loader is None:
        raise error(f"cannot import {path_s!r} as a Python file")
    module = importlib.util.module_from_spec(loader)
    sys.modules[mod_name] = module
    if progress is not None:
        progress(f"executing {path_s} (a {what} is run as Python code)" + (", then " + then.format(attr=attr) if then else ""))
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # sibling imports work, as under `python FILE.py`
    try:
        loader.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        sys.modules.pop(mod_name, None)  # no half-imported module left behind
        raise error(f"importing {path_s} failed: {_describe_exit(exc)}") from exc
    return module, attr, path_s


def load_model(
    spec: str, progress: Optional[Callable[[str], None]] = None, *, effects: Any = None, hold_output: bool = False
) -> tuple[Any, tuple[Any, ...], dict[str, Any], str]:
    """Resolve an example name or ``FILE.py:ATTR`` to ``(model, args, kwargs, label)``.

    ``FILE.py`` is executed as ``python FILE.py`` would run it (its folder on
    ``sys.path``, so sibling imports work); ``progress`` is told so. While the
    file runs and its function is called (``edgeplug._user_code.contained``),
    a change of working folder is undone and threads left running are
    recorded in ``effects`` (an ``Effects``), with what it printed where
    ``hold_output``.
    """
    name = registry_name(spec)
    if name is not None:
        return (*_check_contract(MODELS[name].build(), spec), spec)
    if ":" in spec:
        terminal = sys.stderr

        def told(msg: str) -> None:  # edgeplug's own progress line is not the model's output: never held
            with contextlib.redirect_stderr(terminal):
                progress(msg)

        with contained(effects if effects is not None else Effects(), hold_output=hold_output):
            module, attr, path_s = import_user_file(
                spec, "model file", progress=told if progress is not None else None, then="calling {attr}()"
            )
            fn = getattr(module, attr, None)
            if fn is None or not callable(fn):
                raise EdgeplugError(
                    f"{path_s} has no callable {attr!r}; it must define a function returning "
                    "(model, args) or (model, args, kwargs)"
                )
            try:
                result = fn()
            except (Exception, SystemExit) as exc:
                raise EdgeplugError(f"calling {spec} failed: {_describe_exit(exc)}") from exc
        return (*_check_contract(result, spec, fn), spec)
    if spec.endswith(".py"):
        raise EdgeplugError(
            f"{spec!r} names a file but not what to call in it: use {spec}:FUNCTION, a function in the "
            "file returning (model, args) or (model, args, kwargs)"
        )

    names = [*MODELS, *(n for n in EXAMPLES if n not in model_renames("edgeplug lower"))]
    close = difflib.get_close_matches(spec, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise EdgeplugError(f"unknown model {spec!r}{hint}: use one of {', '.join(names)}, or FILE.py:ATTR")
