"""The `edgeplug` command line on the samsung backend (the command line itself is the core's tests/test_cli.py)."""

from __future__ import annotations


import pytest

from edgeplug.testing import backends_row

pytestmark = pytest.mark.usefixtures("edgeplug_plain_env", "_no_sdk_in_tmp_path")


@pytest.fixture
def _no_sdk_in_tmp_path(monkeypatch, tmp_path):
    monkeypatch.delenv("EXYNOS_AI_LITECORE_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)


def test_backends_row_says_the_sdk_is_not_configured(edgeplug_cli):
    code, out, err = edgeplug_cli("backends", "--no-adapter")
    assert code == 0, err
    assert "EXYNOS_AI_LITECORE_ROOT is not set" in backends_row(out, "samsung")


def test_lowering_without_the_sdk_names_its_variable(edgeplug_cli, tmp_path):
    code, stdout, stderr = edgeplug_cli("lower", "mlp", "--backend", "samsung", "-o", tmp_path / "m.pte")
    assert code != 0 and stdout == ""
    assert stderr.startswith("edgeplug: error: backend 'samsung' cannot serialize its delegate here")
    assert "(EXYNOS_AI_LITECORE_ROOT is not set)" in stderr and "set EXYNOS_AI_LITECORE_ROOT to its root" in stderr
    assert "Use --dry-run" in stderr
    assert not list(tmp_path.rglob("*.pte"))
