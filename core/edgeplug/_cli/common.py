"""What every `edgeplug` command shares: how an error line is printed, and which stream errors are the environment's."""

from __future__ import annotations

import errno
import sys

#: set to 1 to print a failure's traceback (as --debug does)
DEBUG_ENV = "EDGEPLUG_DEBUG"

#: errors writing to stdout/stderr that are the environment's, and the exit code each ends with
STREAM_ERRORS = {errno.EPIPE: 141, errno.ENOSPC: 74, errno.EIO: 74, errno.EDQUOT: 74, errno.EFBIG: 74}


def err(msg: str) -> None:
    """``edgeplug: error: MSG`` on stderr."""
    print(f"edgeplug: error: {msg}", file=sys.stderr)
