"""Names a façade publishes without importing them: the one mechanism behind ``edgeplug``,
``edgeplug.plugin`` and ``edgeplug._zoo``, each of which keeps only its own table.

``__getattr__, __dir__ = lazy_names(__name__, TABLE, hint)`` in a module makes each ``name`` of
``TABLE`` (``name -> (module, attribute)``; attribute ``None``: the module itself) import on first
use and stay in the module's namespace after; an unknown name raises ``AttributeError`` with
``hint``. ``dir()`` lists the table's names beside what is loaded.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping, Optional


def lazy_names(
    module: str, table: Mapping[str, tuple[str, Optional[str]]], hint: str = ""
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``module`` (see the module docstring)."""
    namespace = sys.modules[module].__dict__

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {module!r} has no attribute {name!r}{hint}")
        source, attribute = table[name]
        value = importlib.import_module(source)
        if attribute is not None:
            value = getattr(value, attribute)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *table})

    return __getattr__, __dir__
