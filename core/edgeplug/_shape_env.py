"""Keep a caller's ExportedProgram usable after a lowering: its ShapeEnv's pending unbacked symbols.

A program with data-dependent sizes (``input_pos[0].item()`` feeding a KV-cache
update or ExecuTorch's ``llama::custom_sdpa``) carries unbacked symbols in a
``ShapeEnv`` that every copy of the program shares: deep-copying an
``ExportedProgram`` copies its graph, not its fake mode. Retracing a copy
(``run_decompositions``, ``to_edge``) allocates fresh unbacked symbols in that
shared env and leaves them *pending*; the next trace of the caller's program
(a second lowering, stock ExecuTorch on the same object) then fails with
``PendingUnbackedSymbolNotFound``, although nothing in the caller's graph
changed. ExecuTorch's own ``to_edge_transform_and_lower`` does the same to a
program lowered twice.

``kept_shape_envs(program)`` lowers with each env's pending list empty (a
program stock ExecuTorch already traced once still lowers) and restores the
list on exit, so a lowering leaves the caller's program as it found it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


def shape_envs(program: Any) -> list[Any]:
    """The distinct ShapeEnvs the fake values of ``program``'s graph refer to (none for a module)."""
    graph = getattr(program, "graph", None)
    if graph is None:
        return []
    envs: dict[int, Any] = {}
    for node in graph.nodes:
        val = node.meta.get("val")
        for value in val if isinstance(val, (tuple, list)) else (val,):
            env = getattr(getattr(value, "fake_mode", None), "shape_env", None)
            if env is not None:
                envs.setdefault(id(env), env)
    return list(envs.values())


@contextlib.contextmanager
def kept_shape_envs(program: Any) -> Iterator[None]:
    """Run the body, then give each ShapeEnv of ``program`` back the pending unbacked symbols it had."""
    saved = [(env, list(env.pending_fresh_unbacked_symbols)) for env in shape_envs(program)
             if isinstance(getattr(env, "pending_fresh_unbacked_symbols", None), list)]
    try:
        # symbols another tracer left pending (stock to_edge on the same program) are not this lowering's
        for env, _ in saved:
            env.pending_fresh_unbacked_symbols.clear()
        yield
    finally:
        for env, pending in saved:
            env.pending_fresh_unbacked_symbols[:] = pending
