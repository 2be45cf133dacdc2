"""The `edgeplug` command line (console script ``edgeplug = edgeplug._cli:main``; ``python -m edgeplug._cli``).

``app``: the parser and error handling; ``plugins``: backends, plugins, new-backend, examples;
``lower``: lower, report; ``common``: the error line. The zoo's command is ``edgeplug._zoo._cli``.
"""

from edgeplug._cli.app import build_parser, main

__all__ = ["build_parser", "main"]
