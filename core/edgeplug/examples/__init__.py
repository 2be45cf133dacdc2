"""Built-in example models.

Each example is a callable returning ``(model, args)``: the same contract as
``edgeplug lower FILE.py:ATTR``, whose function may also return
``(model, args, kwargs)`` (keyword inputs, as ``edgeplug.lower`` takes them). Everything is built in code and
seeded; nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from edgeplug._errors import EdgeplugError

ExampleFn = Callable[[], tuple[Any, tuple[Any, ...]]]


def _llama() -> tuple[Any, tuple[Any, ...]]:
    from edgeplug.examples.llama import tiny_llama

    return tiny_llama()


def _gemma_norm() -> tuple[Any, tuple[Any, ...]]:
    from edgeplug.examples.llama import gemma_style_block

    return gemma_style_block()


def _mlp() -> tuple[Any, tuple[Any, ...]]:
    from edgeplug.examples.llama import small_mlp

    return small_mlp()


EXAMPLES: dict[str, tuple[ExampleFn, str]] = {
    "llama": (_llama, "tiny Llama-style decoder: RMSNorm, causal attention, SwiGLU (2 layers, dim 64)"),
    "gemma-block": (_gemma_norm, "Gemma-style block: RMSNorm scaled by (1 + w), attention, GeGLU"),
    "mlp": (_mlp, "two linear layers with a GELU (smallest smoke test)"),
}


def list_examples() -> dict[str, str]:
    return {k: d for k, (_, d) in EXAMPLES.items()}


def _check_contract(result: Any, spec: str) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """``(model, args)`` or ``(model, args, kwargs)``: a module (or ExportedProgram) and its example inputs."""
    import torch

    from edgeplug._inputs import example_inputs

    expected = "expected a tuple (model, args) or (model, args, kwargs)"
    if not (isinstance(result, tuple) and len(result) in (2, 3)):
        size = f" of {len(result)} items" if isinstance(result, tuple) else ""
        raise EdgeplugError(f"{spec} returned {type(result).__name__}{size}, {expected}")
    model, args, kwargs = (*result, None) if len(result) == 2 else result
    if not isinstance(model, (torch.nn.Module, torch.export.ExportedProgram)):
        raise EdgeplugError(
            f"{spec} returned a model of type {type(model).__name__}, {expected} "
            "whose model is a torch.nn.Module"
        )
    given = example_inputs(args, kwargs, where=f"{spec}'s return value (model, args, kwargs)")
    return model, given.args, given.kwargs


def _describe_exit(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r}); a model file must return (model, args), not exit"
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
    spec: str, progress: Optional[Callable[[str], None]] = None
) -> tuple[Any, tuple[Any, ...], dict[str, Any], str]:
    """Resolve an example name or ``FILE.py:ATTR`` to ``(model, args, kwargs, label)``.

    ``FILE.py`` is executed as ``python FILE.py`` would run it (its folder on
    ``sys.path``, so sibling imports work); ``progress`` is told so.
    """
    if spec in EXAMPLES:
        return (*_check_contract(EXAMPLES[spec][0](), spec), spec)
    if ":" in spec:
        module, attr, path_s = import_user_file(spec, "model file", progress=progress, then=f"calling {{attr}}()")
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
        return (*_check_contract(result, spec), spec)
    if spec.endswith(".py"):
        raise EdgeplugError(
            f"{spec!r} names a file but not what to call in it: use {spec}:FUNCTION, a function in the "
            "file returning (model, args) or (model, args, kwargs)"
        )
    import difflib

    known = ", ".join(EXAMPLES)
    close = difflib.get_close_matches(spec, EXAMPLES, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise EdgeplugError(f"unknown example {spec!r}{hint}: use one of {known}, or FILE.py:ATTR")
