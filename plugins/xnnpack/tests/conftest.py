"""Fixtures of the XNNPACK plugin's tests (the core's own are in tests/conftest.py)."""

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


@pytest.fixture(scope="session")
def zoo():
    """``edgeplug._zoo``: the built-in tiny transformers models (build, exported), run_cell."""
    import edgeplug._zoo

    return edgeplug._zoo
