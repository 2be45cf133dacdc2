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


def _wheel(source: str, tmp_path: Path) -> zipfile.ZipFile:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path), str(REPO / source)],
        check=True, capture_output=True, text=True,
    )
    (wheel,) = tmp_path.glob("*.whl")
    return zipfile.ZipFile(wheel)


def _metadata(wheel: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in wheel.namelist() if n.endswith(".dist-info/" + name)] or [None]
    return wheel.read(path).decode() if path else ""


def test_a_library_distribution_two_plugins_require_is_no_backend(tmp_path):
    """The shared library of a plugin family builds alone, declares no backend, and its plugins require it, not each other."""
    lib = _wheel("plugins/vulkan_delegate", tmp_path / "lib")
    names = set(lib.namelist())
    assert {"edgeplug_vulkan_delegate/kernel_contract.py", "edgeplug_vulkan_delegate/patches.py"} <= names
    assert "[edgeplug]" not in _metadata(lib, "entry_points.txt")  # a library: no backend of its own
    for plugin, own in (("webgpu", "edgeplug_webgpu/hooks.py"), ("vulkan", "edgeplug_vulkan/hooks.py")):
        wheel = _wheel(f"plugins/{plugin}", tmp_path / plugin)
        requires = [l.split(":", 1)[1].strip() for l in _metadata(wheel, "METADATA").splitlines() if l.startswith("Requires-Dist:")]
        assert "edgeplug-vulkan-delegate==0.1.0" in requires, requires
        assert not any(r.startswith("edgeplug-vulkan==") or r.startswith("edgeplug-webgpu") for r in requires), requires
        assert own in wheel.namelist() and not any(n.startswith("edgeplug_vulkan_delegate/") for n in wheel.namelist())
