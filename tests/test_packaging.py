"""Building the distributions the README installs (`pip install ./ ./plugins/X`) leaves the checkout as it was."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if "__pycache__" not in p.parts}


@pytest.mark.parametrize("source", [".", "plugins/vulkan"], ids=["core", "a plugin"])
def test_a_wheel_build_writes_nothing_into_the_checkout(source, tmp_path):
    folder = (REPO / source).resolve()
    before = _tree(folder) if source != "." else {p.name for p in folder.iterdir()}
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path), str(folder)],
        check=True, capture_output=True, text=True,
    )
    after = _tree(folder) if source != "." else {p.name for p in folder.iterdir()}
    assert after == before, sorted(after ^ before)  # no build/, no *.egg-info
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    if source == ".":  # the package's data files travel with it
        assert {"edgeplug/py.typed", "edgeplug/_vendor/dagre.min.js", "edgeplug/_report_page/report.js"} <= names
    else:
        assert "edgeplug_vulkan/kernels/rms_norm.comp" in names
    assert not any(n.startswith(("tests/", "plugins/")) for n in names)
