"""One truth about where verification runs: the record, `edgeplug backends` and `--verify` agree.

- A ``BackendSpec`` with a ``device_runtime`` and ``verify_method="none"`` is invalid (``--verify`` would be refused
  while `edgeplug backends` said the runtime runs it): the error names both fields and what to set.
- ``verify_method="pte"`` with the backend's own runtime missing and a delegate ExecuTorch's Python runtime does not
  link: `edgeplug backends` says `--verify` is refused, with the runtime's install hint, and `lower --verify` is
  refused before any work with that hint (before, it lowered, then failed in the runtime with "error: 0x20" and a
  native log line, the hint lost).
"""

from __future__ import annotations

import types

import pytest
from pydantic import ValidationError

import edgeplug_fixture_backends as fb  # tests/fixtures/backends (put on the path by conftest)
from edgeplug.plugin import BackendSpec, RuntimeNotFound, hookimpl
from edgeplug.testing import assert_no_traceback, error_line

NAME = "fixture-own-runtime"
HINT = "build it with `make fixture-runtime` (docs/fixture-runtime.md)"


def _missing_runtime():
    raise RuntimeNotFound(f"no fixture runtime on this machine: {HINT}")


def _spec(**fields):
    fields = {"backend": NAME, "description": "a backend with a runtime of its own (an edgeplug test backend)",
              "backend_id": fb.BACKEND_IDS[fb.TABLE], "partitioner": fb.table_partitioner, **fields}
    return BackendSpec(**fields)


def test_a_device_runtime_with_verify_method_none_is_refused_naming_the_fields():
    with pytest.raises(ValidationError, match=r"device_runtime is given with verify_method 'none'.*set verify_method"):
        _spec(device_runtime=_missing_runtime, verify_method="none")
    _spec(device_runtime=_missing_runtime, verify_method="pte")  # either fallback is fine
    _spec(device_runtime=_missing_runtime, verify_method="kernels")
    _spec(verify_method="none")  # and "none" without a runtime of its own


def _plugin():
    hooks = types.SimpleNamespace()

    @hookimpl
    def edgeplug_backends():
        yield _spec(device_runtime=_missing_runtime, verify_method="pte")

    hooks.edgeplug_backends = edgeplug_backends
    return hooks


def test_backends_and_verify_agree_where_no_runtime_has_the_delegate(edgeplug_register, cli, tmp_path):
    edgeplug_register(_plugin(), name="own-runtime")
    code, out, err = cli("backends", "--no-adapter", "--no-probe")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith(f"{NAME} runtime:"))
    assert line.startswith(f"{NAME} runtime: none, --verify is refused: it verifies by running the .pte (verify_method 'pte'), "
                           f"but ExecuTorch's Python runtime has no {fb.BACKEND_IDS[fb.TABLE]} delegate"), line
    assert HINT in line and "host emulation" not in line

    out_pte = tmp_path / "m.pte"
    code, out, err = cli("lower", "mlp", "-b", NAME, "--verify", "-o", out_pte, "-q")
    assert code != 0 and not out_pte.exists(), err
    first = error_line(err)
    assert f"backend {NAME!r} cannot verify here: it verifies by running the .pte" in first, first
    assert HINT in first and "nothing was done" in first and "0x20" not in err
    assert_no_traceback(err)
    # without --verify the same backend lowers and writes its .pte
    code, out, err = cli("lower", "mlp", "-b", NAME, "-o", out_pte, "-q")
    assert code == 0 and out_pte.stat().st_size > 0, err
