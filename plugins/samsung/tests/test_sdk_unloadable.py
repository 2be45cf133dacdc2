"""An SDK whose libraries do not load makes samsung unavailable, naming the library and LD_LIBRARY_PATH (issue 28).

Moved from the core's tests/test_hostile_inputs.py (issue 23).
"""

from __future__ import annotations

import edgeplug
from edgeplug.testing import write_unloadable_library


def test_an_sdk_whose_libraries_do_not_load_is_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("EXYNOS_AI_LITECORE_ROOT", str(tmp_path))
    write_unloadable_library(tmp_path / "lib/x86_64/libenn.so")
    a = edgeplug.get_backend("samsung").availability()
    assert not a.ok and "LD_LIBRARY_PATH" in a.hint
    assert "libenn.so is there but does not load (libqq0.so: cannot open shared object file" in a.reason
