"""Fixtures of the Vulkan delegate family's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def cli(capsys):
    """Run ``edgeplug ARGS...`` in this process: returns (exit code, stdout, stderr)."""
    from edgeplug._cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse usage errors
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run
