"""What every `edgeplug` command shares: how an error line is printed."""

from __future__ import annotations

import sys

#: set to 1 to print a failure's traceback (as --debug does)
DEBUG_ENV = "EDGEPLUG_DEBUG"


def err(msg: str) -> None:
    """``edgeplug: error: MSG`` on stderr."""
    print(f"edgeplug: error: {msg}", file=sys.stderr)
