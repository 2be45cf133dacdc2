"""The model zoo: ``edgeplug zoo`` as ``make zoo`` runs it (docs/zoo.md).

Every built-in zoo architecture (tiny, randomly initialised transformers
models: nothing is downloaded) through every installed backend, float, each
cell beside stock executorch in its own process; ``edgeplug zoo --help`` says
what each argument does, and ``edgeplug._zoo`` is the API underneath.

    python bench/zoo.py [edgeplug zoo arguments, e.g. --models llama,qwen3 --backends vulkan --jobs 2]
"""

from __future__ import annotations

import sys

#: what the zoo's Markdown is made with, each unless the arguments give that option themselves
DEFAULTS = [("--schemes", "float"), ("--compare-stock", None), ("--markdown", "docs/zoo.md")]


def main(argv: list[str]) -> int:
    from edgeplug._cli import main as edgeplug

    given = {a.split("=")[0] for a in argv if a.startswith("--")}
    defaults = [w for flag, value in DEFAULTS if flag not in given for w in (flag, value) if w is not None]
    return edgeplug(["zoo", *defaults, *argv])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
