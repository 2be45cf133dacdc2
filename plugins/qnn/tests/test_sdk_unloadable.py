"""An SDK whose libraries do not load makes qnn unavailable, naming the library and LD_LIBRARY_PATH (issue 28).

Moved from the core's tests/test_hostile_inputs.py (issue 23).
"""

from __future__ import annotations

from pathlib import Path

import torch

import edgeplug


def _unloadable_library(path: Path) -> None:
    """A real shared library that needs one that is nowhere on the loader path."""
    libshm = Path(torch.__file__).parent / "lib" / "libshm.so"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(libshm.read_bytes().replace(b"libc10.so\0", b"libqq0.so\0"))


def test_an_sdk_whose_libraries_do_not_load_is_unavailable(monkeypatch, tmp_path):
    backend, variable, library = "qnn", "QNN_SDK_ROOT", "lib/x86_64-linux-clang/libQnnHtp.so"
    _unloadable_library(tmp_path / "sdk" / library)
    monkeypatch.setenv(variable, str(tmp_path / "sdk"))
    a = edgeplug.get_backend(backend).availability()
    assert not a.ok
    assert f"{Path(library).name} is there but does not load (libqq0.so: cannot open shared object file" in a.reason
    assert "LD_LIBRARY_PATH" in a.hint
