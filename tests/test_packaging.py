"""Building the distributions the README installs (`pip install ./ ./plugins/X`) leaves the checkout as it was.

Every plugin found under plugins/ is built, whatever its name: a plugin added later is covered
without editing this file. What one plugin family's wheels must hold beyond that is tested in
that family's own tests.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PLUGINS = sorted(p.parent for p in (REPO / "plugins").glob("*/pyproject.toml"))


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if "__pycache__" not in p.parts}


def _packages(folder: Path) -> list[Path]:
    """The import packages a plugin's folder holds at its top (its tests are no package of the wheel)."""
    return [p.parent for p in folder.glob("*/__init__.py") if p.parent.name != "tests"]


def test_plugins_are_found_on_disk():
    assert PLUGINS, f"no plugins/*/pyproject.toml under {REPO.name}: the checkout lost its plugins"
    assert all(_packages(p) for p in PLUGINS), [p.name for p in PLUGINS if not _packages(p)]


@pytest.mark.parametrize("source", [REPO, *PLUGINS], ids=["core", *(f"plugins/{p.name}" for p in PLUGINS)])
def test_a_wheel_build_writes_nothing_into_the_checkout(source, tmp_path):
    core = source == REPO
    before = {p.name for p in source.iterdir()} if core else _tree(source)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path), str(source)],
        check=True, capture_output=True, text=True,
    )
    after = {p.name for p in source.iterdir()} if core else _tree(source)
    assert after == before, sorted(after ^ before)  # no build/, no *.egg-info
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    if core:  # the package's data files travel with it
        assert {"edgeplug/py.typed", "edgeplug/_vendor/dagre.min.js", "edgeplug/_report/page/report.js"} <= names
    else:  # every file of the plugin's packages travels, data files (kernel sources, tables) included
        files = {
            str(f.relative_to(source)) for pkg in _packages(source) for f in pkg.rglob("*")
            if f.is_file() and "__pycache__" not in f.parts
        }
        assert files and files <= names, f"{wheel.name} lacks {sorted(files - names)}: declare them as package data"
    assert not any(n.startswith(("tests/", "plugins/")) for n in names)
