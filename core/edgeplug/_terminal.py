"""Text for a terminal: what edgeplug prints is shown, never acted on.

Names, messages and reasons edgeplug prints come from the model, its exceptions, plugins and saved
files; any of them can carry what a terminal acts on rather than shows (an ESC or C1 sequence that
retitles the window, clears the screen or writes the clipboard; a bidirectional override that reorders
the line). ``terminal_safe`` writes each such character as its escape; every line edgeplug prints (the
report's text, ``edgeplug: error:`` and ``warning:`` lines, progress, listings) goes through it.
"""

from __future__ import annotations

import re

#: characters a terminal acts on rather than shows: C0/C1 controls (ESC starts colour, cursor and title
#: sequences; NUL, BEL, backspace, carriage return overwrite or hide text) and the bidirectional
#: overrides and isolates that reorder what follows them on the line (CVE-2021-42574's "Trojan Source")
_TERMINAL_ACTS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    """``text`` with every character a terminal would act on written as its escape (``\\x1b``,
    ``\\u202e``). Newlines and tabs stay."""
    return _TERMINAL_ACTS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


__all__ = ["terminal_safe"]
