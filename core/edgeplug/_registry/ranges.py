"""The ExecuTorch range each plugin declares it was tested with, and the one warning for a plugin outside it.

A plugin declares the range in its distribution's metadata, as a requirement on ``executorch``
(``dependencies = ["edgeplug==...", "executorch>=1.4,<1.6"]`` in its pyproject): pip reads it at install, and
``edgeplug plugins`` shows it. A plugin used on an ExecuTorch outside its range still loads (the user may try);
one ``edgeplug: warning:`` line at load names it, its range and the installed release, the way pytest
warns of a plugin's unmet requirement. A plugin registered in code has no metadata: it declares nothing.
"""

from __future__ import annotations

import functools
from importlib import metadata
from typing import Optional

from packaging.requirements import InvalidRequirement, Requirement

from edgeplug._executorch import installed_version, satisfies
from edgeplug._registry.info import PluginInfo


@functools.lru_cache(maxsize=256)
def _declared(distribution: str) -> Optional[str]:
    try:
        requires = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return None
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name.lower() == "executorch" and (req.marker is None or req.marker.evaluate()):
            return str(req.specifier) or "any"
    return None


def declared_range(info: PluginInfo) -> Optional[str]:
    """The executorch range ``info``'s distribution requires (e.g. ``">=1.4,<1.6"``; ``"any"`` for a bare
    requirement), or None where it declares none (or was registered in code)."""
    if info.registered or not info.distribution:
        return None
    return _declared(info.distribution)


def outside_declared_range(info: PluginInfo) -> Optional[str]:
    """One line when the installed executorch is outside the range ``info`` declares, else None."""
    declared = declared_range(info)
    if declared is None or declared == "any":
        return None
    version = installed_version("executorch")
    if version is None or satisfies(version, declared):
        return None
    return (
        f"{info.describe()} was tested with executorch{declared}, and this is executorch {version}: it may fail "
        f"where that release differs; install a release of the plugin made for executorch {version}, or "
        f"executorch{declared}"
    )
