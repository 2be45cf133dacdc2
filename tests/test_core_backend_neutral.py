"""The core names no backend: what is specific to one lives in its plugin.

Rule, for every module under core/edgeplug: no import of
``executorch.backends.<vendor>`` (``executorch.backends.transforms`` is
shared, not a vendor's), and no identifier or string literal naming a backend
or a vendor's op namespace. Docstrings and comments may mention backends (as
examples of what a plugin does); code may not. A few strings name backends
for a reason that is not backend behaviour; each is listed below with it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parent.parent / "core" / "edgeplug"
VENDOR = re.compile(r"vulkan|webgpu|qnn|samsung|xnnpack|exynos|htp|qualcomm|et_vk|\benn\b", re.IGNORECASE)
# executorch.backends.transforms: passes every backend shares; executorch.backends.test: ExecuTorch's backend test
# suite and its Tester harness, which edgeplug.testing.executorch_suite runs every backend through
SHARED_BACKEND_PACKAGES = {"transforms", "test"}

#: (module, word) -> why that module may name it in a string
ALLOWED = {
    # install hints name the first-party distributions a user can pip install
    ("_cli.py", "vulkan"): "install hint",
    ("_cli.py", "webgpu"): "install hint",
    ("_cli.py", "qnn"): "install hint",
    ("_cli.py", "samsung"): "install hint",
    ("_cli.py", "xnnpack"): "install hint",
    ("_backend.py", "vulkan"): "install hint / did-you-mean over first-party names",
    ("_backend.py", "webgpu"): "install hint / did-you-mean over first-party names",
    ("_backend.py", "qnn"): "install hint / did-you-mean over first-party names",
    ("_backend.py", "samsung"): "install hint / did-you-mean over first-party names",
    ("_backend.py", "xnnpack"): "install hint / did-you-mean over first-party names",
    ("_backend.py", "coreml"): "install hint / did-you-mean over first-party names",
    # wgpu's own vocabulary: "Vulkan" is the graphics API an adapter runs on
    ("_runtime/device.py", "vulkan"): "wgpu adapter backend type and driver install hint",
    # `edgeplug new-backend` templates: the executorch partitioners a new plugin may start from
    ("_scaffold.py", "xnnpack"): "new-backend template",
    ("_scaffold.py", "vulkan"): "new-backend template",
    # docs/zoo.md states this project's targets for its first-party backends (issue 13) and how the page
    # was made; the cells themselves take every backend from its plugin (zoo/_cell.py names none)
    **{("_zoo/_render.py", w): "docs/zoo.md's targets for the first-party backends" for w in ("vulkan", "webgpu", "xnnpack", "qnn", "samsung", "et_vk")},
}

def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _words(tree: ast.AST):
    """(line, kind, text) for every identifier and string literal except docstrings."""
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield line, "string", node.value
        elif isinstance(node, ast.Name):
            yield line, "name", node.id
        elif isinstance(node, ast.Attribute):
            yield line, "name", node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield line, "name", node.name
        elif isinstance(node, ast.arg):
            yield line, "name", node.arg
        elif isinstance(node, ast.keyword) and node.arg:
            yield line, "name", node.arg
        elif isinstance(node, ast.alias):
            yield line, "import", node.name + (f" as {node.asname}" if node.asname else "")
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield line, "import", node.module


def violations(path: Path, rel: str = "") -> list[str]:
    rel = rel or path.relative_to(CORE).as_posix()
    out = []
    for line, kind, text in _words(ast.parse(path.read_text(), str(path))):
        if kind == "import":
            parts = text.split(" as ")[0].split(".")
            if parts[:2] == ["executorch", "backends"] and len(parts) > 2 and parts[2] not in SHARED_BACKEND_PACKAGES:
                out.append(f"{rel}:{line}: imports {text}")
                continue
        for m in VENDOR.finditer(text):
            word = m.group(0).lower()
            if kind == "string" and (rel, word) in ALLOWED:
                continue
            out.append(f"{rel}:{line}: {kind} {text!r} names {word!r}")
    return out


#: modules that still carry a backend, each with where it belongs; xfail until moved
IN_PROGRESS: dict[str, str] = {}

MODULES = sorted(CORE.rglob("*.py"))


def _param(path: Path):
    rel = path.relative_to(CORE).as_posix()
    marks = [pytest.mark.xfail(reason=IN_PROGRESS[rel], strict=False)] if rel in IN_PROGRESS else []
    return pytest.param(path, id=rel, marks=marks)


@pytest.mark.parametrize("path", [_param(p) for p in MODULES])
def test_core_module_names_no_backend(path):
    found = violations(path)
    assert not found, "backend-specific code in the core (move it to the plugin):\n" + "\n".join(found)


def test_the_check_catches_what_it_forbids(tmp_path):
    """The rule fails on each thing it forbids, and passes docstrings and comments."""
    bad = tmp_path / "probe.py"
    cases = {
        "import executorch.backends.vulkan.custom_ops_lib\n": "imports",
        "from executorch.backends.qualcomm.builders import x\n": "imports",
        "TARGETS = ('aten.rms_norm', 'et_vk.rms_norm')\n": "et_vk",
        "def f(p):\n    return type(p).__name__ == 'WebGPUPartitioner'\n": "webgpu",
        "def without_executorch_vulkan_pattern():\n    pass\n": "vulkan",
    }
    for src, expect in cases.items():
        bad.write_text(src)
        found = violations(bad, "probe.py")
        assert found and expect in found[0].lower(), (src, found)
    bad.write_text('"""Vulkan and QNN are examples here."""\n# a comment about xnnpack\nfrom executorch.backends.transforms import x\n')
    assert violations(bad, "probe.py") == []
    bad.write_text("HINT = 'pip install edgeplug-vulkan'\n")  # allowed in _cli.py only
    assert violations(bad, "_cli.py") == [] and violations(bad, "probe.py")
