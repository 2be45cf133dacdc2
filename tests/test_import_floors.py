"""The core's floors: no module imports one on a floor above its own, and only the façade reads the
process's plugin manager.

The house, bottom up (``FLOORS``; a module is on the floor of the longest prefix that names it). An
arrow A -> B is an import of B in A, at module level or inside a function (an import deferred into a
function is an arrow all the same); one under ``if TYPE_CHECKING:`` is not (it never runs). Arrows
within a floor, or down, are the house working; one up is a lower floor reaching for what a higher one
knows, and fails here. What the lower floor needs is handed in by the floor above (a ``Backend``, a
fusion veto), or moved down beside the records.

``edgeplug._registry.lookup`` holds the process's one plugin manager: it is on the top floor, so that
only the façade (``edgeplug._facade``, the CLI, the zoo's commands, the conformance suite) turns a name
into a ``Backend``, once, against the registry the caller chose; everything below takes that ``Backend``.

``python tests/test_import_floors.py`` prints each floor's modules and every arrow up.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_import_graph as graph_reader  # noqa: E402  (the same ast reader: one notion of an import)

#: bottom up; each entry a module or package prefix
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # what a plugin yields and what the core raises; the one door to ExecuTorch's private names; where a
    # plugin's own code is (what every error blaming a plugin names)
    ("records", ("edgeplug._errors", "edgeplug._api", "edgeplug._lazy", "edgeplug._records", "edgeplug._hookspecs",
                 "edgeplug._executorch", "edgeplug._plugin_code")),
    # what needs no plugin: inputs, outputs, eager runs, the user's code, the built-in models, devices, text
    ("support", ("edgeplug._shape_env", "edgeplug._failures", "edgeplug._user_code", "edgeplug._inputs",
                 "edgeplug._outputs", "edgeplug._memory", "edgeplug._models", "edgeplug._runtime",
                 "edgeplug._scaffold", "edgeplug.examples", "edgeplug._eager", "edgeplug._weights",
                 "edgeplug._terminal")),
    # graph tools and the pass runner; ``_fusion.target`` is the op a FusionPolicy names, resolved through
    # the graph's ops, which the registry checks each policy with at load (its docstring: below the registry)
    ("graph", ("edgeplug._graph", "edgeplug._fusion.target")),
    # plugins loaded and one backend's contributions resolved (no process-wide state: that is lookup's)
    ("registry", ("edgeplug._registry", "edgeplug._backend")),
    ("fusion", ("edgeplug._fusion",)),
    ("partition", ("edgeplug._partition",)),
    ("report", ("edgeplug._report", "edgeplug._lowered", "edgeplug._explorer")),
    ("quantize and verify", ("edgeplug._quantize", "edgeplug._result", "edgeplug._verify", "edgeplug._stock")),
    ("pipeline", ("edgeplug._pipeline",)),
    # where a name becomes a Backend: the two public façades, the process's registry, the commands
    # (``edgeplug`` names the package's own module only, not everything under it)
    ("façade", ("edgeplug", "edgeplug.plugin", "edgeplug._facade", "edgeplug._registry.lookup", "edgeplug._cli",
                "edgeplug._zoo", "edgeplug.testing",
                # the previous plugin API's module paths (edgeplug._api.old_path): a stub each, deprecated
                "edgeplug.records", "edgeplug.hookspecs", "edgeplug.errors", "edgeplug.plugins", "edgeplug.partition",
                "edgeplug.graph", "edgeplug.runtime")),
)
#: the one module holding the process's plugin manager, and who may import it (prefixes)
LOOKUP = "edgeplug._registry.lookup"
MAY_IMPORT_LOOKUP = ("edgeplug._facade", "edgeplug._registry", "edgeplug._cli", "edgeplug._zoo", "edgeplug.testing")


def floor_of(module: str) -> Optional[int]:
    """The index in ``FLOORS`` of the longest prefix naming ``module`` (None: no floor names it)."""
    best: tuple[int, int] = (-1, -1)
    for i, (_, prefixes) in enumerate(FLOORS):
        for p in prefixes:
            under = module.startswith(p + ".") and p != "edgeplug"
            if (module == p or under) and len(p) > best[0]:
                best = (len(p), i)
    return best[1] if best[1] >= 0 else None


def arrows(graph: graph_reader.ImportGraph) -> list[tuple[str, str, Optional[int]]]:
    """(importer, imported, line or None for module level) for every edgeplug import, deferred ones included.

    A package whose ``__init__`` imports nothing of edgeplug is a namespace: importing one of its modules is
    an arrow to that module, not to the package (``_registry.validation`` -> ``_fusion.target``)."""

    def real(targets: list[str] | set[str]) -> list[str]:
        return sorted(
            b for b in targets
            if not (graph.edges.get(b) == set() and graph.files[b].name == "__init__.py"
                    and any(t.startswith(b + ".") for t in targets))
        )

    out = [(a, b, None) for a, targets in graph.edges.items() for b in real(targets)]
    out += [(d.module, t, d.line) for d in graph.deferred for t in real(d.targets)]
    return out


def upward(graph: graph_reader.ImportGraph) -> list[str]:
    found = []
    for a, b, line in arrows(graph):
        fa, fb = floor_of(a), floor_of(b)
        if fa is not None and fb is not None and fb > fa:
            where = graph_reader._where(graph, a, line)
            found.append(f"{where}: {a} ({FLOORS[fa][0]}) imports {b} ({FLOORS[fb][0]})")
    return found


def test_every_core_module_is_on_a_floor():
    graph = graph_reader.import_graph()
    loose = sorted(m for m in graph.files if floor_of(m) is None)
    assert not loose, f"modules no floor names (add each to FLOORS in {Path(__file__).name}): {loose}"


def test_no_arrow_runs_up_the_house():
    found = upward(graph_reader.import_graph())
    assert not found, (
        "imports of a higher floor (hand what is needed in from above, or move it down beside the records):\n  "
        + "\n  ".join(found)
    )


def test_only_the_facade_reads_the_process_registry():
    graph = graph_reader.import_graph()
    readers = sorted(
        graph_reader._where(graph, a, line) for a, b, line in arrows(graph)
        if b == LOOKUP and not any(a == p or a.startswith(p + ".") for p in MAY_IMPORT_LOOKUP)
    )
    assert not readers, (
        f"modules below the façade importing {LOOKUP} (the process's plugin manager): take the Backend the "
        "façade resolved instead:\n  " + "\n  ".join(readers)
    )


def test_the_checks_see_a_planted_arrow_up_and_a_planted_registry_reader(tmp_path, monkeypatch):
    """The checks above can fail: an upward import in a function and a lookup reader, planted in a copy."""
    package = tmp_path / "edgeplug"
    for sub in ("_graph", "_registry", "_pipeline"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "_registry" / "lookup.py").write_text("X = 1\n")
    (package / "_pipeline" / "run.py").write_text("from edgeplug._graph import names\n")  # down: fine
    (package / "_graph" / "names.py").write_text(
        "def f():\n    from edgeplug._pipeline import run  # up, hidden in a function\n"
    )
    (package / "_graph" / "passes.py").write_text("from edgeplug._registry.lookup import X\n")
    monkeypatch.setattr(graph_reader, "CORE", tmp_path)
    monkeypatch.setattr(graph_reader, "PACKAGE", package)
    graph = graph_reader.import_graph()
    found = upward(graph)
    assert any("edgeplug/_graph/names.py:2: edgeplug._graph.names (graph) imports edgeplug._pipeline.run (pipeline)" in f
               for f in found), found
    assert any("edgeplug._graph.passes (graph) imports edgeplug._registry.lookup (façade)" in f for f in found), found
    assert not any("_pipeline/run.py" in f for f in found)
    with pytest.raises(AssertionError, match=r"_graph/passes.py"):
        test_only_the_facade_reads_the_process_registry()


if __name__ == "__main__":
    g = graph_reader.import_graph()
    for i, (name, _) in enumerate(FLOORS):
        print(f"{i} {name}: {len([m for m in g.files if floor_of(m) == i])} modules")
    for line in upward(g):
        print("up:", line)
