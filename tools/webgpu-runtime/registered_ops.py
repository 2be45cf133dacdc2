#!/usr/bin/env python3
"""Record the ops a built WebGPU runtime registers, for the webgpu backend's support check.

    registered_ops.py BUILD_DIR [--commit SHA]

BUILD_DIR is a folder tools/webgpu-runtime/build.sh wrote (``<cache>/webgpu-runtime/<commit>``). The runtime's
operator registry is filled at start-up by its ``WEBGPU_REGISTER_OP(name, fn)`` calls, one per op, in the op
sources its CMake globs; the name is the one the Vulkan serialization writes for a node (its target's
``__name__``: ``aten.mm.default``, ``et_vk.rms_norm.default``) and the one the runtime looks an op up by when it
loads a program. This reads the sources the build compiled into the backend (``build/compile_commands.json``,
the entries of the ``webgpu_backend`` target: a source the build did not compile does not count), finds every
registration, and writes ``BUILD_DIR/bin/registered_ops.json`` (written whole or not at all):

    {"format": 1, "executorch_commit": SHA, "sources": N, "ops": [sorted names]}

edgeplug's webgpu plugin reads it where it finds this build (``edgeplug_webgpu.runtime_ops``). Nothing of
ExecuTorch's is changed: only the build folder gets the file. build.sh runs this after each build; run it by hand
for a build made before it did. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

FORMAT = 1
FILE = "registered_ops.json"
#: the object folder of the backend's CMake target: its compile commands name it
TARGET_DIR = "webgpu_backend.dir"
_REGISTRATION = re.compile(r"\bWEBGPU_REGISTER_OP\s*\(\s*([A-Za-z_][A-Za-z0-9_.]*)\s*,")
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_STRINGS = re.compile(r'"(?:\\.|[^"\\\n])*"')


def registrations(text: str) -> list[str]:
    """The op names a C++ source registers (comments and string literals are not code; the macro's own
    ``#define`` lives in a header, which the build does not compile on its own)."""
    code = _COMMENTS.sub(" ", _STRINGS.sub('""', text))
    code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith("#define"))
    return _REGISTRATION.findall(code)


def compiled_sources(build: Path) -> list[Path]:
    """The sources the build compiled into the WebGPU backend, from CMake's compile commands."""
    commands = build / "build" / "compile_commands.json"
    if not commands.is_file():
        raise SystemExit(f"registered_ops.py: error: {commands} does not exist: {build} is not a finished "
                         "tools/webgpu-runtime/build.sh build (ExecuTorch's CMake writes that file when it configures)")
    entries = json.loads(commands.read_text())
    files = sorted({Path(e["directory"], e["file"]).resolve() for e in entries
                    if TARGET_DIR in e.get("output", "") + " " + e.get("command", " ".join(e.get("arguments", [])))})
    if not files:
        raise SystemExit(f"registered_ops.py: error: {commands} compiles no source into the WebGPU backend "
                         f"(no {TARGET_DIR}): was the build configured with EXECUTORCH_BUILD_WEBGPU=ON?")
    return files


def scan(build: Path) -> tuple[list[str], int]:
    sources = compiled_sources(build)
    names: set[str] = set()
    for src in sources:
        names.update(registrations(src.read_text(errors="replace")))
    if not names:
        raise SystemExit(f"registered_ops.py: error: none of the {len(sources)} sources compiled into the WebGPU "
                         "backend registers an op (WEBGPU_REGISTER_OP): the runtime's registry has another form in "
                         "this ExecuTorch tree, and this scan needs updating")
    return sorted(names), len(sources)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("build", type=Path, help="a build folder of tools/webgpu-runtime/build.sh")
    p.add_argument("--commit", default="", help="the ExecuTorch commit built (default: bin/runtime.json's)")
    a = p.parse_args(argv)
    build = a.build.resolve()
    commit = a.commit
    info = build / "bin" / "runtime.json"
    if not commit and info.is_file():
        commit = str(json.loads(info.read_text()).get("executorch_commit", ""))
    if not commit:
        raise SystemExit(f"registered_ops.py: error: no --commit given and {info} names none")
    names, sources = scan(build)
    out = build / "bin" / FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"format": FORMAT, "executorch_commit": commit, "sources": sources, "ops": names}, indent=1)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{FILE}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(body + "\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as any file the build writes (mkstemp makes it private)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
    print(f"== {len(names)} ops registered in {sources} sources of the WebGPU backend -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
