"""The model zoo: any model set x backends x schemes, each cell in its own process, locally or on Ray.

    import edgeplug._zoo
    cells = edgeplug._zoo.run(["llama", "qwen3"], ["xnnpack", "vulkan"], compare_stock=True, jobs=2,
                             out="cells.jsonl")
    print(edgeplug._zoo.table(cells))

The command is ``edgeplug zoo`` (``edgeplug zoo --help``). The built-in models
are tiny, randomly initialised transformers models (``MODELS``; nothing is
downloaded); ``FILE.py:FUNCTION`` entries and ``@FILE`` lists add others.
Names load on first use: ``import edgeplug._zoo`` imports neither torch nor ray.
"""

from __future__ import annotations

from edgeplug._lazy import lazy_names

_NAMES = {
    # running a zoo
    "run": "_run", "plan": "_run", "load_cells": "_run", "Settings": "_run", "EXECUTORS": "_run",
    "table": "_render", "render_page": "_render", "summary": "_render", "targets": "_render",
    # one cell
    "Cell": "_record", "Side": "_record", "comparable": "_record", "STATUSES": "_record", "FLOAT": "_record",
    "run_cell": "_cell", "schemes_of": "_cell",
    "CellTarget": "_lowering", "target": "_lowering", "lower_stock": "_lowering", "lower_edgeplug": "_lowering",
    "execute_cell": "_isolate",
    # the built-in models
    "MODELS": "_models", "DEFAULT_MODELS": "_models", "Arch": "_models", "build": "_models",
    "exported": "_models", "count_norms": "_models", "resolve_models": "_models", "load_entry": "_models",
    "DECODER": "_models", "SEQ": "_models", "VOCAB": "_models",
}

__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_names(__name__, {name: (f"edgeplug._zoo.{m}", name) for name, m in _NAMES.items()})
