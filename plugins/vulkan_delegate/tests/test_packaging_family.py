"""The vulkan family's wheels: the shared library builds alone and declares no backend; its plugins require it, not each other."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

PLUGINS = Path(__file__).resolve().parents[2]


def _wheel(name: str, out: Path) -> zipfile.ZipFile:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(out), str(PLUGINS / name)],
        check=True, capture_output=True, text=True,
    )
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def _metadata(wheel: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in wheel.namelist() if n.endswith(".dist-info/" + name)] or [None]
    return wheel.read(path).decode() if path else ""


def test_a_library_distribution_two_plugins_require_is_no_backend(tmp_path):
    lib = _wheel("vulkan_delegate", tmp_path / "lib")
    names = set(lib.namelist())
    assert {"edgeplug_vulkan_delegate/kernel_contract.py", "edgeplug_vulkan_delegate/_executorch.py"} <= names
    assert "[edgeplug]" not in _metadata(lib, "entry_points.txt")  # a library: no backend of its own
    for plugin, own in (("webgpu", "edgeplug_webgpu/hooks.py"), ("vulkan", "edgeplug_vulkan/hooks.py")):
        wheel = _wheel(plugin, tmp_path / plugin)
        requires = [row.split(":", 1)[1].strip() for row in _metadata(wheel, "METADATA").splitlines() if row.startswith("Requires-Dist:")]
        assert "edgeplug-vulkan-delegate==0.1.0" in requires, requires
        assert not any(r.startswith("edgeplug-vulkan==") or r.startswith("edgeplug-webgpu") for r in requires), requires
        assert own in wheel.namelist() and not any(n.startswith("edgeplug_vulkan_delegate/") for n in wheel.namelist())


def test_the_vulkan_wheel_carries_its_kernel_source(tmp_path):
    """The GLSL source is compiled at lowering time: a wheel without it lowers nothing custom."""
    assert "edgeplug_vulkan/kernels/rms_norm.comp" in _wheel("vulkan", tmp_path).namelist()
