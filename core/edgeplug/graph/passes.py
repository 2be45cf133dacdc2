"""The pass runner every backend pass goes through."""

from __future__ import annotations

from typing import Any, Sequence

from torch.export import ExportedProgram

from edgeplug.errors import PassError
from edgeplug.records import PassSpec


def _graph_modules(ep: ExportedProgram):
    for _, mod in ep.graph_module.named_modules():
        if hasattr(mod, "graph"):
            yield mod


def run_passes(ep: ExportedProgram, passes: Sequence[PassSpec], *, backend: Any = None) -> ExportedProgram:
    """Run ``passes`` in order; lint after each; name the failing pass."""
    done: list[str] = []
    for spec in passes:
        origin = backend.origin(spec) if backend is not None else None
        who = f"plugin {origin.name!r} ({origin.distribution})" if origin else "a plugin"
        try:
            out = spec.fn(ep)
            if out is not None:
                ep = out
            for gm in _graph_modules(ep):
                gm.graph.lint()
                gm.recompile()
        except Exception as exc:
            before = ", ".join(done) or "none"
            raise PassError(
                f"{spec.stage}-stage pass {spec.name!r} of backend {spec.backend!r} from {who} "
                f"failed: {type(exc).__name__}: {exc} (passes run before it: {before})"
            ) from exc
        done.append(spec.name)
    return ep
