"""The built-in zoo: the registry's transformers models (``edgeplug._models``, ``transformers-*``)
under the zoo's names (``llama`` is ``transformers-llama``), how they are built, and how a model
entry of ``edgeplug zoo --models`` resolves to something a cell can build.

An entry is a built-in name (``llama``), its registry name (``transformers-llama``: the same cell), a
transformers class the built-in zoo knows (``LlamaForCausalLM``, ``Qwen3Config``), another registry
model (``handwritten-llama-decoder``, ``executorch-llama``, ...: built as ``edgeplug lower`` builds it,
``--layers`` does not apply), ``FILE.py:FUNCTION`` (the function returns
``(model, args)`` or ``(model, args, kwargs)``, as ``edgeplug lower`` takes it), or
``@FILE`` listing entries (one a line or comma-separated; ``#`` starts a comment; a relative
FILE.py there is relative to the list).
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import torch

from edgeplug._errors import EdgeplugError
from edgeplug.examples import load_model
from edgeplug._models import DECODER, MODELS as REGISTRY, SEQ, VOCAB, ZOO_NAMES, Arch  # noqa: F401 (re-exported)

# DECODER, SEQ, VOCAB and Arch are the zoo's names too (edgeplug._zoo's table, _render, benches)

#: the zoo's names (cell records, docs/zoo.md) for the registry's transformers models (edgeplug._models)
MODELS: dict[str, Arch] = {short: REGISTRY[name].arch for short, name in ZOO_NAMES.items()}


#: a transformers model's registry name -> the zoo's name (its cells are keyed by the zoo's name)
_ZOO_NAME_OF = {name: short for short, name in ZOO_NAMES.items()}

#: what `make zoo` runs (jamba: a second hybrid, on request)
DEFAULT_MODELS = [m for m in MODELS if m != "jamba"]


def resolve_models(entries: list[str] | str | None) -> list[str]:
    """The cell keys of ``entries`` (see the module's docstring), in order, without repeats.

    Raises EdgeplugError naming the entry that resolves to nothing, and what would."""
    if entries is None:
        return list(DEFAULT_MODELS)
    if isinstance(entries, str):
        entries = [entries]
    out: list[str] = []
    for raw in entries:
        for entry in (e.strip() for e in raw.split(",")):
            if not entry:
                continue
            for key in _resolve_one(entry, source=None):
                if key not in out:
                    out.append(key)
    if not out:
        raise EdgeplugError("no model given: name built-in zoo models (" + ", ".join(MODELS) + "), FILE.py:FUNCTION or @FILE")
    return out


def _resolve_one(entry: str, source: Optional[str]) -> list[str]:
    where = f" (in {source})" if source else ""
    if entry.startswith("@"):
        path = Path(entry[1:])
        if not path.is_file():
            raise EdgeplugError(f"model list {entry[1:]!r}{where} does not exist: @FILE names a file listing models")
        keys: list[str] = []
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0]
            for item in (i.strip() for i in line.split(",")):
                if item:
                    keys.extend(_resolve_one(item, source=entry[1:]))
        return keys
    if entry in MODELS:
        return [entry]
    if entry in REGISTRY:  # a registry name: a transformers model under the zoo's name, any other as it is
        return [_ZOO_NAME_OF.get(entry, entry)]
    for name, arch in MODELS.items():
        if entry in (arch.model, arch.config):
            return [name]
    if ":" in entry:
        file, _, function = entry.rpartition(":")
        if not file.endswith(".py") or not function.isidentifier():
            raise EdgeplugError(f"model {entry!r}{where}: expected FILE.py:FUNCTION")
        if source and not Path(file).is_absolute():
            file = str(Path(source).resolve().parent / file)  # relative to the list that names it
        if not Path(file).is_file():
            raise EdgeplugError(f"model file {file!r}{where} does not exist (from {entry!r})")
        # absolute: a cell's process, or a Ray worker, may start in another folder
        return [f"{Path(file).resolve()}:{function}"]
    close = difflib.get_close_matches(entry, [*MODELS, *REGISTRY], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    others = [name for name in REGISTRY if name not in _ZOO_NAME_OF]
    raise EdgeplugError(
        f"unknown model {entry!r}{where}{hint}: use a built-in zoo name ({', '.join(MODELS)}), its registry name "
        f"(transformers-llama, ...) or transformers class (LlamaForCausalLM, ...), another registry model "
        f"({', '.join(others)}), FILE.py:FUNCTION, or @FILE listing them"
    )


def label(key: str) -> str:
    """How a cell's model is shown: the built-in name, a registry name, or ``FUNCTION (FILE.py)``."""
    if key in MODELS or key in REGISTRY:
        return key
    path, _, function = key.rpartition(":")
    return f"{function} ({Path(path).name})"


# --------------------------------------------------------------------------- models


class Forward(torch.nn.Module):
    """``input_ids -> tensor`` (logits or hidden states): what both lowerings export."""

    def __init__(self, model: torch.nn.Module, call: dict, output: str) -> None:
        super().__init__()
        self.model = model
        self.call = dict(call)
        self.output = output

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(input_ids=input_ids, **self.call), self.output)


def build(name: str, layers: Optional[int] = None) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """The zoo's tiny model ``name`` and its example inputs; the same numbers in every process.

    ``layers`` overrides the config's layer count (the tests use 1)."""
    return build_arch(MODELS[name], layers)


def build_arch(arch: Arch, layers: Optional[int] = None) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """transformers' model of ``arch`` (randomly initialised, norm weights moved off their init) and its inputs."""
    # transformers: an optional dependency, needed for the zoo's built-in models only (not for FILE.py:FUNCTION)
    import transformers

    settings = {**arch.base, **arch.overrides}
    if layers is not None:
        settings["num_layers" if "num_layers" in settings else "num_hidden_layers"] = layers
    config = getattr(transformers, arch.config)(**settings)
    torch.manual_seed(0)
    model = getattr(transformers, arch.model)(config).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in model.modules():  # not the init's ones (or zeros): a wrong weight must show
            w = getattr(module, "weight", None)
            if "Norm" in type(module).__name__ and isinstance(w, torch.nn.Parameter):
                w.add_(0.2 * torch.randn(w.shape, generator=g, dtype=w.dtype))
    ids = torch.randint(0, VOCAB, (1, SEQ), generator=g)
    return Forward(model, arch.call, arch.output).eval(), (ids,)


def count_norms(ep: torch.export.ExportedProgram) -> int:
    """Norms present: ``rsqrt`` and ``rms_norm`` nodes of an aten-dialect program."""
    names = {"aten::rsqrt", "aten::rms_norm"}
    return sum(
        1
        for n in ep.graph.nodes
        if n.op == "call_function" and getattr(getattr(n.target, "_schema", None), "name", None) in names
    )


@lru_cache(maxsize=2)
def exported_call(key: str, layers: Optional[int] = None) -> tuple[Any, Any, tuple, dict, int]:
    """(model, aten-dialect program, args, kwargs, norms present) of a resolved entry, once per process."""
    model, args, kwargs = load_entry(key, layers)
    if isinstance(model, torch.export.ExportedProgram):
        return model.module(), model, args, kwargs, count_norms(model)
    with torch.no_grad():
        ep = torch.export.export(model, args, kwargs or None)
    return model, ep, args, kwargs, count_norms(ep)


def exported(key: str, layers: Optional[int] = None) -> tuple[Any, Any, tuple, int]:
    """(model, aten-dialect program, example inputs, norms present) of a model without keyword inputs."""
    model, ep, args, _, norms = exported_call(key, layers)
    return model, ep, args, norms

def load_entry(key: str, layers: Optional[int] = None) -> tuple[Any, tuple, dict]:
    """``(model, args, kwargs)`` of a resolved entry: a built-in model, or what FILE.py:FUNCTION returns."""
    if key in MODELS:
        model, inputs = build(key, layers)
        return model, inputs, {}
    model, args, *rest = load_model(key)
    kwargs = rest[0] if rest and isinstance(rest[0], dict) else {}
    return model, tuple(args), kwargs
