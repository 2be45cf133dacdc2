"""edgeplug on the ExecuTorch releases users have (issue 43): the tested range, each plugin's declared range and
the one warning outside it, and a missing ExecuTorch feature said as that, never as a bug in edgeplug.

What runs on 1.4.1 itself is CI's second run (``make test EXECUTORCH=1.4.1``): the same suite on that release.
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

import edgeplug
from edgeplug import _executorch

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
#: every distribution of this repository's plugins/ (read from their pyproject, so none is named here)
FIRST_PARTY = sorted(tomllib.loads(p.read_text())["project"]["name"] for p in PLUGINS.glob("*/pyproject.toml"))


def _executorch_requirements(dist: str) -> list[SpecifierSet]:
    reqs = [Requirement(r) for r in metadata.requires(dist) or []]
    return [r.specifier for r in reqs if r.name == "executorch"]


def test_the_installed_release_is_in_the_tested_range_and_the_core_requires_that_range():
    version = metadata.version("executorch")
    assert _executorch.in_tested_range(version), version
    assert _executorch.range_warning() is None
    assert _executorch_requirements("edgeplug") == [SpecifierSet(_executorch.TESTED_RANGE)]


@pytest.mark.parametrize("version, inside", [
    ("1.4.0", True), ("1.4.1", True), ("1.5.1", True), ("1.5.2rc1", True), ("1.3.9", False), ("1.6.0", False),
    ("2.0.0", False), ("not-a-version", False),
])
def test_the_tested_range_holds_both_releases_and_no_other(version, inside):
    assert _executorch.in_tested_range(version) is inside


@pytest.mark.parametrize("dist", FIRST_PARTY)
def test_every_first_party_plugin_declares_the_range_it_is_tested_with(dist):
    assert _executorch_requirements(dist) == [SpecifierSet(_executorch.TESTED_RANGE)], dist


def test_a_plugin_made_for_an_older_release_is_named_in_one_warning(fixture_site, cli):
    """The fixture plugin declares executorch<1.5: warned about on 1.5 (CI's first run), not on 1.4 (its second)."""
    fixture_site("old_executorch")
    code, out, err = cli("plugins")
    assert code == 0
    version = metadata.version("executorch")
    warnings = [line for line in err.splitlines() if "edgeplug-fixture-oldet" in line]
    if _executorch.satisfies(version, "<1.5"):
        assert warnings == [], err
        assert "tested with  executorch<1.5\n" in out, out
        return
    assert len(warnings) == 1, err
    line = warnings[0]
    assert line.startswith("edgeplug: warning: ") and "'oldet'" in line
    assert "executorch<1.5" in line and f"executorch {version}" in line
    assert "tested with  executorch<1.5 (outside it here" in out
    # the first-party plugins are inside their range: no warning names them
    assert FIRST_PARTY and not [line for line in err.splitlines() if any(d in line for d in FIRST_PARTY)], err


def test_a_plugin_importing_what_the_release_lacks_is_refused_naming_that_not_a_bug(fixture_site, cli, tmp_path):
    fixture_site("old_executorch")
    code, out, err = cli("lower", "mlp", "--backend", "oldet", "--dry-run", "-o", str(tmp_path / "m.pte"))
    assert code == 2, err
    assert "has no module executorch.backends.oldet_only_in_an_old_release" in err, err
    assert "'oldet'" in err and f"executorch {metadata.version('executorch')}" in err
    assert "bug in edgeplug" not in err and "Traceback" not in err
    assert not (tmp_path / "m.pte").exists()


def test_the_python_api_raises_the_version_error_before_any_work(fixture_site):
    fixture_site("old_executorch")
    import torch

    with pytest.raises(edgeplug.ExecutorchVersionError, match="oldet_only_in_an_old_release"):
        edgeplug.lower(torch.nn.Linear(4, 4), (torch.randn(1, 4),), backend="oldet", dry_run=True)


def test_version_gaps_are_told_apart_from_other_import_errors():
    with pytest.raises(ImportError) as missing_name:
        from executorch.exir import a_name_no_release_has  # noqa: F401
    assert "lacks a_name_no_release_has (in executorch.exir)" in _executorch.version_gap(missing_name.value)
    with pytest.raises(ImportError) as unrelated:
        import edgeplug_no_such_module  # noqa: F401
    assert _executorch.version_gap(unrelated.value) is None
    assert _executorch.version_gap(ValueError("cannot import name 'x' from 'executorch.exir'")) is None


def test_a_missing_feature_names_itself_what_needs_it_and_the_release():
    with pytest.raises(edgeplug.ExecutorchVersionError) as err:
        edgeplug.plugin.executorch_feature(
            "executorch.exir", "a_feature_from_the_future", needed_for="the frobnicator", since="9.1"
        )
    text = str(err.value)
    assert "lacks a_feature_from_the_future (executorch.exir)" in text
    assert "the frobnicator" in text and "ExecuTorch 9.1 and later" in text and _executorch.TESTED_RANGE in text
    assert edgeplug.plugin.executorch_has("executorch.exir", "to_edge")
    assert not edgeplug.plugin.executorch_has("executorch.exir", "a_feature_from_the_future")
    assert not edgeplug.plugin.executorch_has("executorch.no_such_package")


def test_backends_says_what_edgeplug_runs_on(cli):
    code, out, err = cli("backends", "--no-adapter", "--no-probe")
    assert code == 0
    line = next(line for line in out.splitlines() if line.startswith("runs on: "))
    assert f"executorch {metadata.version('executorch')}" in line and f"torch {metadata.version('torch')}" in line
    assert "torchao" in line and f"tested with executorch{_executorch.TESTED_RANGE}" in line
    assert "outside" not in line and "warning" not in err
