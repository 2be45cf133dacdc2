"""tools/vulkan-runtime/build.sh on a machine whose cache folder does not exist yet (issue 47): with --glslang,
the glslang step wrote its log into that missing folder, so the redirect failed, and the script's own message
never printed under `set -e` (its `tail` of the missing log failed first): `make vulkan-runtime` failed on a
fresh machine without a word of why. Here cmake stands in (it fails at once) and the cache folder is new: the
script must end with its own error line naming the log, and the log must be there."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "vulkan-runtime" / "build.sh"


def _tree(root: Path, files: list[str], dirs: list[str]) -> Path:
    for d in dirs:
        (root / d).mkdir(parents=True, exist_ok=True)
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("")
    return root


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_glslang_step_on_an_empty_cache_fails_with_its_own_message(tmp_path):
    src = _tree(tmp_path / "executorch", [
        "CMakeLists.txt", "third-party/flatbuffers/CMakeLists.txt",
        "backends/vulkan/third-party/Vulkan-Headers/include/vulkan/vulkan.h",
        "backends/vulkan/third-party/volk/volk.c",
        "backends/vulkan/third-party/VulkanMemoryAllocator/include/vk_mem_alloc.h",
    ], ["backends/vulkan/runtime"])
    glslang = _tree(tmp_path / "glslang", ["CMakeLists.txt"], ["glslang"])
    tools = tmp_path / "bin"
    tools.mkdir()
    for name, body in (("cmake", "echo 'CMake Error: stand-in configure failed'; exit 1"), ("ninja", "exit 0"), ("g++", "exit 0")):
        (tools / name).write_text(f"#!/bin/sh\n{body}\n")
        (tools / name).chmod(0o755)
    cache = tmp_path / "fresh" / "cache"  # neither folder exists
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    p = subprocess.run(["bash", str(SCRIPT), str(src), "--glslang", str(glslang), "--cache", str(cache), "--jobs", "1"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2, (p.returncode, p.stderr)
    log = cache / "glslang.log"
    assert f"build.sh: error: glslang build failed (log: {log})" in p.stderr
    assert "stand-in configure failed" in log.read_text() and "stand-in configure failed" in p.stderr
    assert "No such file or directory" not in p.stderr
