"""Fixtures of the XNNPACK plugin's tests (the core's own are in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def zoo():
    """``edgeplug._zoo``: the built-in tiny transformers models (build, exported), run_cell."""
    import edgeplug._zoo

    return edgeplug._zoo
