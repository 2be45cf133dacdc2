"""What every `edgeplug` command shares: how an error line is printed, and which stream errors are the environment's."""

from __future__ import annotations

import errno
import sys
from typing import Optional, TextIO

from edgeplug._terminal import terminal_safe

#: set to 1 to print a failure's traceback (as --debug does)
DEBUG_ENV = "EDGEPLUG_DEBUG"

#: errors writing to stdout/stderr that are the environment's, and the exit code each ends with
STREAM_ERRORS = {errno.EPIPE: 141, errno.ENOSPC: 74, errno.EIO: 74, errno.EDQUOT: 74, errno.EFBIG: 74}

#: errors of a write that did not fit (the disk, a quota, a file size limit), and the exit code they end with
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
DISK_FULL_CODE = 74


def say(text: str, file: Optional[TextIO] = None, flush: bool = False) -> None:
    """One of edgeplug's own lines (stderr unless ``file``), with what a terminal would act on escaped: the
    text may hold a model's exception, a plugin's name or a file's contents (``edgeplug._terminal``)."""
    print(terminal_safe(text), file=file or sys.stderr, flush=flush)


def err(msg: str) -> None:
    """``edgeplug: error: MSG`` on stderr, escaped (``say``)."""
    say(f"edgeplug: error: {msg}")
