"""The walk of one fusion stays in one package, each phase entered once (issue 38).

``edgeplug.fuse`` is traced with ``sys.setprofile``: each call into an edgeplug module is charged to the
nearest edgeplug frame below it (a call torch makes back into edgeplug, e.g. ``map_aggregate`` over our
function, counts as made by the edgeplug code that called torch). From those calls:

- every edgeplug module the fusion enters is in ``edgeplug._fusion``, or below it (``_graph``, the
  records and errors), or the veto's own path (the partition's delegation veto, handed in by the caller,
  and the backend's support check);
- the orchestrator, ``edgeplug._fusion.program``, enters each module once, and the phases in
  their order: target, delegation, match, decision, fold, rewrite;
- the modules' calls form no cycle: no module calls back into one that called it, so read top-down
  the walk visits each module once;
- what fusion reads of a graph (op predicates, the constant analysis) comes from one module,
  ``edgeplug._fusion.nodes``: the others take only tools that change a graph from ``edgeplug._graph``.

``python tests/test_fusion_walk.py`` prints the walk (the orchestrator's calls, and every module-to-module
edge) for two norms on the fixture backend that fuses into its own op.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable, Iterable

import torch

import edgeplug

ORCHESTRATOR = "edgeplug._fusion.program"
PHASES = (
    "edgeplug._fusion.target",
    "edgeplug._partition.delegation",
    "edgeplug._fusion.rms_norm",
    "edgeplug._fusion.decision",
    "edgeplug._fusion.fold",
    "edgeplug._fusion.rewrite",
)
#: what a fusion may enter outside its package: what it is built on, and the veto's path to the backend (the
#: façade resolves the backend and hands the partition's veto in: ``edgeplug._facade.fuse``)
BELOW = ("edgeplug._graph", "edgeplug._records", "edgeplug._errors", "edgeplug._executorch")
VETO_PATH = ("edgeplug._facade", "edgeplug._backend", "edgeplug._partition", "edgeplug.plugin", "edgeplug._lazy")


def _is_edgeplug(module: str) -> bool:
    return module == "edgeplug" or module.startswith("edgeplug.")


def trace_calls(run: Callable[[], object]) -> list[tuple[str, str]]:
    """(caller module, callee module) for each call into edgeplug code that crosses modules, in order."""
    calls: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        if not _is_edgeplug(callee):
            return
        up = frame.f_back
        while up is not None and not _is_edgeplug(up.f_globals.get("__name__", "")):
            up = up.f_back
        if up is None:
            return
        caller = up.f_globals["__name__"]
        if caller != callee:
            calls.append((caller, callee))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def walk_problems(
    calls: Iterable[tuple[str, str]], orchestrator: str, phases: tuple[str, ...], allowed: tuple[str, ...]
) -> list[str]:
    """What breaks the walk's three rules (module docstring), one line each; empty when it holds."""
    calls = list(calls)
    problems = []
    outside = sorted({m for c in calls for m in c if not any(m == a or m.startswith(a + ".") for a in allowed)})
    if outside:
        problems.append(f"the fusion entered modules outside its package and what it stands on: {outside}")
    entered = Counter(callee for caller, callee in calls if caller == orchestrator)
    twice = {m: n for m, n in entered.items() if n > 1}
    if twice:
        problems.append(f"{orchestrator} entered these modules more than once: {twice}")
    order = [callee for caller, callee in calls if caller == orchestrator and callee in phases]
    if order != [p for p in phases if p in order] or set(order) != set(phases):
        problems.append(f"the phases ran as {order}, not {list(phases)}")
    edges = defaultdict(set)
    for caller, callee in calls:
        edges[caller].add(callee)
    for a in sorted(edges):
        for b in sorted(edges[a]):
            seen, todo = set(), [b]
            while todo:
                here = todo.pop()
                if here == a:
                    problems.append(f"{a} calls {b}, and {b} calls back into {a} (through {sorted(seen) or 'nothing'})")
                    todo = []
                    break
                if here not in seen:
                    seen.add(here)
                    todo.extend(edges.get(here, ()))
    return problems


class _TwoNorms(torch.nn.Module):
    """Two norms with a linear between: the first's weight a parameter, the second's ``1 + w`` (folded)."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.rand(16) + 0.5)
        self.lin = torch.nn.Linear(16, 16)
        self.w2 = torch.nn.Parameter(torch.randn(16) * 0.1)

    def forward(self, x):
        h = self.lin(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w1)
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + self.w2)


def fusion_walk(backend_name: str) -> tuple[list[tuple[str, str]], list]:
    """The calls of the second ``edgeplug.fuse`` of ``_TwoNorms`` (the first imports what fusion needs)."""
    from executorch.exir import to_edge

    torch.manual_seed(0)
    ep = to_edge(torch.export.export(_TwoNorms().eval(), (torch.randn(2, 16),))).exported_program()
    backend = edgeplug.get_backend(backend_name)
    edgeplug.fuse(ep, backend)
    out: dict = {}
    calls = trace_calls(lambda: out.update(records=edgeplug.fuse(ep, backend)[1]))
    return calls, out["records"]


def test_one_fusion_walks_the_phases_once_each_in_one_package(fixture_backends):
    calls, records = fusion_walk(fixture_backends.FUSED)
    assert [r.outcome for r in records] == ["fused", "folded_weight"], records  # the walk did both kinds of work
    problems = walk_problems(calls, ORCHESTRATOR, PHASES, ("edgeplug._fusion", *BELOW, *VETO_PATH))
    assert not problems, "\n".join(problems)


def test_the_walk_checker_sees_a_broken_walk():
    """Each rule fails on a walk that breaks it, so the test above could fail."""
    phases = ("p.a", "p.b")
    good = [("p", "p.a"), ("p.a", "low"), ("p", "p.b"), ("p.b", "low")]
    assert walk_problems(good, "p", phases, ("p", "low")) == []
    assert "outside" in walk_problems([*good, ("p.b", "elsewhere")], "p", phases, ("p", "low"))[0]
    assert "more than once" in walk_problems([*good, ("p", "p.a")], "p", phases, ("p", "low"))[0]
    assert "phases ran as" in walk_problems([("p", "p.b"), ("p", "p.a")], "p", phases, ("p",))[0]
    assert "calls back" in walk_problems([*good, ("low", "p.a")], "p", phases, ("p", "low"))[0]


FUSION = Path(__file__).resolve().parents[1] / "core" / "edgeplug" / "_fusion"
#: what a fusion module other than ``nodes`` may take from ``edgeplug._graph``: tools that change a graph
GRAPH_EDITS = frozenset({"fold_constants", "ancestors", "remove_dead", "replace_uses", "copy_meta", "fake_mode_of", "edge_ops", "copy_graph"})


def graph_reads(source: str, path: str) -> list[str]:
    """``path:line name`` for each name a module takes from ``edgeplug._graph`` that is not a graph edit."""
    out = []
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("edgeplug._graph"):
            out += [f"{path}:{node.lineno} {a.name}" for a in node.names if a.name not in GRAPH_EDITS]
        elif isinstance(node, ast.Import):
            out += [f"{path}:{node.lineno} {a.name}" for a in node.names if a.name.startswith("edgeplug._graph")]
    return out


def test_fusion_reads_the_graph_through_one_module():
    modules = [p for p in sorted(FUSION.glob("*.py")) if p.name != "nodes.py"]
    found = [hit for p in modules for hit in graph_reads(p.read_text(), p.name)]
    assert not found, "fusion modules reading the graph other than through edgeplug._fusion.nodes:\n  " + "\n  ".join(found)
    assert graph_reads("from edgeplug._graph.ops import is_qdq\nfrom edgeplug._graph import fold_constants\n", "x.py") == ["x.py:1 is_qdq"]


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent / "fixtures" / "backends"))
    import edgeplug_fixture_backends

    with edgeplug_fixture_backends.registered() as fb:
        calls, records = fusion_walk(fb.FUSED)
    print("records:", [r.outcome for r in records])
    print("the orchestrator's calls:", *[callee for caller, callee in calls if caller == ORCHESTRATOR], sep="\n  ")
    print("module edges:", *sorted({f"{a} -> {b}" for a, b in calls}), sep="\n  ")
    print("\n".join(walk_problems(calls, ORCHESTRATOR, PHASES, ("edgeplug._fusion", *BELOW, *VETO_PATH))) or "the walk holds")
