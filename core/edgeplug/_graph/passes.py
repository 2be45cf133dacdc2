"""The pass runner every backend pass (and any core pass) goes through.

For each pass of a stage, in order: reserve the names of every existing node
(``reserve_node_names``; a previous pass may have returned a new program or
added a nested graph), run it, then check what it left: every GraphModule of
the program lints (nested ones included) and the graph signature still
matches the placeholders and outputs. A pass that raises or leaves a broken
program is reported with the plugin, the pass, the passes before it and the
original cause, chained as ``__cause__``.

A pass returns what it did (as torch.fx's ``PassResult`` does): ``None`` (it
changed the program in place and has nothing to record), a new
``ExportedProgram``, or a ``PassResult(program, records)``: the program (the
one it was given or a new one) and one ``TransformRecord`` per change it made.
The runner returns the last program with every pass's records, in order; they
are the report's ``transforms``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional, Sequence

import torch
from torch.export import ExportedProgram

from edgeplug._errors import PassError
from edgeplug._graph.names import graph_modules, reserve_node_names
from edgeplug._graph.ops import op_name
from edgeplug._records import PassSpec, TransformRecord
from edgeplug._plugin_code import plugin_location


@dataclass(frozen=True)
class PassResult:
    """What a pass made: the program (the one it was given, changed in place, or a new one) and
    one ``TransformRecord`` per change, in the order it made them."""

    program: ExportedProgram
    records: tuple[TransformRecord, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "records", tuple(self.records))  # a list is taken too


class BrokenProgram(Exception):
    """What a pass left behind fails a check (the cause of a PassError)."""


def check_program(ep: ExportedProgram) -> None:
    """Lint every graph module of ``ep`` and compare its signature with the graph.

    Raises ``BrokenProgram`` naming the graph module and what is wrong.
    """
    for path, mod in ep.graph_module.named_modules():
        if not isinstance(mod, torch.fx.GraphModule):
            continue
        try:
            mod.graph.lint()
        except Exception as exc:
            where = f"nested graph module {path!r}" if path else "the top-level graph"
            raise BrokenProgram(f"{where} does not lint: {exc}") from exc
    graph = ep.graph_module.graph
    placeholders = [n.name for n in graph.nodes if n.op == "placeholder"]
    specs = [getattr(s.arg, "name", None) for s in ep.graph_signature.input_specs]
    if placeholders != specs:
        raise BrokenProgram(
            f"the graph's placeholders {placeholders} do not match the graph signature's inputs {specs} "
            "(a pass that adds or removes an input must update ep.graph_signature.input_specs in the same order)"
        )
    output = next((n for n in reversed(graph.nodes) if n.op == "output"), None)
    outs = output.args[0] if output is not None else ()
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    if len(outs) != len(ep.graph_signature.output_specs):
        raise BrokenProgram(
            f"the graph returns {len(outs)} values but the graph signature lists "
            f"{len(ep.graph_signature.output_specs)} outputs"
        )


def _who(spec: PassSpec, backend: Any) -> str:
    origin = backend.origin(spec) if backend is not None and hasattr(backend, "origin") else None
    return origin.describe() if origin is not None else "an unregistered plugin"


def _fail(spec: PassSpec, backend: Any, done: list[str], what: str, cause: BaseException) -> PassError:
    origin = backend.origin(spec) if backend is not None and hasattr(backend, "origin") else None
    before = ", ".join(repr(d) for d in done) if done else "none"
    if spec.backend == "core":
        target = f" (lowering for backend {backend.name!r})" if getattr(backend, "name", None) else ""
        where = f"{spec.stage}-stage pass {spec.name!r} of the edgeplug core{target}"
        remedy = "please report it to edgeplug with the model that triggers it"
    else:
        where = f"{spec.stage}-stage pass {spec.name!r} of backend {spec.backend!r}, from {_who(spec, backend)},"
        if origin is not None and not origin.registered:
            remedy = (
                f"report it to the maintainers of {origin.distribution}, or disable the plugin with "
                f"EDGEPLUG_DISABLE_PLUGINS={origin.name}"
            )
        elif origin is not None:
            remedy = f"fix it, or unregister the plugin with edgeplug.unregister_plugin({origin.name!r})"
        else:
            remedy = "fix it"
    located = ""
    if origin is not None:
        located = plugin_location(cause, origin)
    err = PassError(
        f"{where} "
        f"{what}: {type(cause).__name__}: {cause}{located}. Passes run before it in this stage: {before}. "
        f"This is a bug in the pass; {remedy}."
    )
    err.pass_name = spec.name
    err.stage = spec.stage
    err.backend = spec.backend
    err.plugin = origin
    err.passes_before = tuple(done)
    return err


def run_passes(
    ep: ExportedProgram, passes: Sequence[PassSpec], *, backend: Any = None, created: Optional[dict[str, str]] = None
) -> PassResult:
    """Run ``passes`` in order on ``ep``; the resulting program and every pass's records, in order.

    ``PassSpec.fn(ep)`` returns None (changed in place), a new
    ExportedProgram, or a ``PassResult`` (the program and its records).
    ``backend`` (an ``edgeplug.Backend``) names the plugin each pass
    came from in errors. Raises ``PassError`` for the first pass that raises or
    leaves a program that fails ``check_program``. ``created``, when given,
    gets ``op name -> the pass`` for every op a pass brought into a program
    that had none (so a later check refusing that op can name who made it).
    """
    done: list[str] = []
    records: list[TransformRecord] = []
    for spec in passes:
        reserve_node_names(ep)
        before = _snapshot(ep)
        marks = _weight_marks(ep)
        ops_before = _ops(ep) if created is not None else frozenset()
        try:
            out = spec.fn(ep)
        except Exception as exc:
            if spec.backend == "core" and getattr(exc, "at_fault", None):
                raise  # a core pass ran the backend's own code, and its error already names who is at fault
            raise _fail(spec, backend, done, "raised", exc) from exc
        if isinstance(out, PassResult):
            wrong = [r for r in out.records if not isinstance(r, TransformRecord)]
            if not isinstance(out.program, ExportedProgram) or wrong:
                what = f"a {type(out.program).__name__} as its program" if wrong == [] else f"a {type(wrong[0]).__name__} among its records"
                cause: Exception = TypeError(f"returned a PassResult with {what}; it holds an ExportedProgram and TransformRecords")
                raise _fail(spec, backend, done, "returned the wrong type", cause)
            ep = out.program
            records.extend(out.records)
        elif out is not None:
            if not isinstance(out, ExportedProgram):
                cause = TypeError(
                    f"returned {type(out).__name__}, expected None (changed in place), an ExportedProgram "
                    "or a PassResult(program, records)"
                )
                raise _fail(spec, backend, done, "returned the wrong type", cause)
            ep = out
        written = _written_in_place(marks)
        if written:
            cause = RuntimeError(
                f"changed the weight {written[0]!r} in place"
                + (f" (and {len(written) - 1} more)" if len(written) > 1 else "")
                + "; the program shares its weights with the caller's model (edgeplug never copies them), so "
                "the caller's tensor changed too: a pass must put a new tensor in the program "
                "(ep.state_dict[name] = new) instead of writing into the one it holds"
            )
            raise _fail(spec, backend, done, "wrote into a weight", cause)
        try:
            check_program(ep)
            for gm in graph_modules(ep.graph_module):
                if not _unchanged(before.get(id(gm)), _code_key(gm)):
                    gm.recompile()
        except Exception as exc:
            raise _fail(spec, backend, done, "left a broken program", exc) from exc
        if created is not None:
            for op in sorted(_ops(ep) - ops_before):
                created.setdefault(op, describe_pass(spec, backend))
        done.append(spec.name)
    return PassResult(ep, tuple(records))


def describe_pass(spec: PassSpec, backend: Any) -> str:
    """``edge-stage pass 'x' of backend 'y', from <plugin>`` (or of the edgeplug core)."""
    if spec.backend == "core":
        return f"the edgeplug core's {spec.stage}-stage pass {spec.name!r}"
    return f"{spec.stage}-stage pass {spec.name!r} of backend {spec.backend!r}, from {_who(spec, backend)}"


def _ops(ep: ExportedProgram) -> frozenset[str]:
    return frozenset(
        op_name(n.target) for gm in graph_modules(ep.graph_module) for n in gm.graph.nodes if n.op == "call_function"
    )


def _code_key(gm: torch.fx.GraphModule) -> tuple:
    """What a GraphModule's generated code depends on, compared by identity and value."""
    return (gm.graph, tuple((n, n.op, n.name, n.target, n.args, n.kwargs) for n in gm.graph.nodes))


def _unchanged(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # e.g. a tensor literal among the args: assume changed
        return False


#: elements of each weight a pass's in-place write is checked on (besides its version counter)
_SAMPLE = 64


def _sample(t: torch.Tensor) -> Optional[torch.Tensor]:
    """Up to ``_SAMPLE`` elements spread over ``t`` (first and last included), as bytes; None if unreadable."""
    try:
        flat = t.detach().reshape(-1) if t.is_contiguous() else None
        if flat is None or flat.numel() == 0 or flat.is_meta:
            return None
        idx = torch.linspace(0, flat.numel() - 1, steps=min(flat.numel(), _SAMPLE), dtype=torch.float64).long()  # fp32 rounds past the end
        return flat[idx].contiguous().view(torch.uint8).clone()
    except (RuntimeError, TypeError):
        return None


def _weight_marks(ep: ExportedProgram) -> list[tuple[str, torch.Tensor, int, Optional[torch.Tensor]]]:
    """Each weight and constant of ``ep``: its name, the tensor, its version counter and a sample of it.

    A write through ``.data`` leaves the version counter as it was, hence the sample: a pass that
    writes a weight in place changes the caller's model, whose tensors the program shares."""
    marks = []
    for name, t in [*ep.state_dict.items(), *ep.constants.items()]:
        if isinstance(t, torch.Tensor) and not isinstance(t, torch._subclasses.FakeTensor):
            marks.append((name, t, t._version, _sample(t)))
    return marks


def _written_in_place(marks: list[tuple[str, torch.Tensor, int, Optional[torch.Tensor]]]) -> list[str]:
    out = []
    for name, t, version, sample in marks:
        now = _sample(t) if sample is not None else None
        if t._version != version or (sample is not None and (now is None or not torch.equal(now, sample))):
            out.append(name)
    return out


def _snapshot(ep: ExportedProgram) -> dict[int, tuple]:
    # Recompiling (Python codegen) is most of a no-op pass's cost: skip the
    # graph modules a pass left exactly as they were.
    return {id(gm): _code_key(gm) for gm in graph_modules(ep.graph_module)}


def core_pass(name: str, fn: Any, stage: Literal["export", "edge", "pre_partition"] = "edge", order: int = 0) -> PassSpec:
    """A PassSpec for a pass the core itself runs through ``run_passes``."""
    return PassSpec(backend="core", stage=stage, name=name, fn=fn, order=order)


__all__ = ["BrokenProgram", "PassResult", "check_program", "core_pass", "describe_pass", "run_passes"]
