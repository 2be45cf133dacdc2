"""The family's patches of executorch: undone on exit, errors included, and written in ``patches.py`` only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parents[2]
FAMILY = ("vulkan_delegate", "vulkan", "webgpu")
#: methods that change a container or module imported from executorch
MUTATORS = {"pop", "popitem", "clear", "update", "setdefault", "__setitem__", "__delitem__", "append", "extend", "remove"}


def executorch_writes(source: str, filename: str = "probe.py") -> list[str]:
    """Lines where ``source`` changes something it imported from executorch (attribute or item assignment,
    a mutating method, ``setattr``/``delattr``)."""
    tree = ast.parse(source, filename)
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {(a.asname or a.name.split(".")[0]) for a in node.names if a.name.startswith("executorch")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("executorch"):
            bound |= {a.asname or a.name for a in node.names}

    def base(expr: ast.AST) -> str:
        while isinstance(expr, (ast.Attribute, ast.Subscript)):
            expr = expr.value
        return expr.id if isinstance(expr, ast.Name) else ""

    found = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            if isinstance(t, (ast.Attribute, ast.Subscript)) and base(t) in bound:
                found.append(f"{filename}:{node.lineno}: writes {ast.unparse(t)}")
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in MUTATORS and base(f.value) in bound:
                found.append(f"{filename}:{node.lineno}: calls {ast.unparse(f)}")
            if isinstance(f, ast.Name) and f.id in ("setattr", "delattr") and node.args and base(node.args[0]) in bound:
                found.append(f"{filename}:{node.lineno}: calls {f.id} on {ast.unparse(node.args[0])}")
    return found


def test_only_the_patches_module_writes_to_executorch():
    sources = [p for name in FAMILY for p in sorted((PLUGINS / name).glob("edgeplug_*/**/*.py"))]
    assert len(sources) >= 10, sources
    writes = {str(p.relative_to(PLUGINS)): executorch_writes(p.read_text(), str(p.relative_to(PLUGINS))) for p in sources}
    patches = writes.pop("vulkan_delegate/edgeplug_vulkan_delegate/patches.py")
    assert patches, "the patches module no longer patches anything: this check would pass vacuously"
    stray = [w for found in writes.values() for w in found]
    assert not stray, "executorch patched outside edgeplug_vulkan_delegate/patches.py (each patch goes there, with its reason):\n" + "\n".join(stray)


def test_the_check_catches_each_kind_of_write():
    cases = {
        "from executorch.backends.vulkan.patterns import fusable_patterns\nfusable_patterns.pop('rms_norm')\n": "calls fusable_patterns.pop",
        "import executorch.backends.vulkan.patterns as vk\nvk.get_all_fusable_subgraphs = len\n": "writes vk.get_all_fusable_subgraphs",
        "from executorch.backends.vulkan import patterns\npatterns.fusable_patterns['x'] = 1\n": "writes patterns.fusable_patterns['x']",
        "import executorch\nsetattr(executorch.exir, 'x', 1)\n": "calls setattr on executorch.exir",
    }
    for src, expect in cases.items():
        found = executorch_writes(src)
        assert found and expect in found[0], (src, found)
    assert executorch_writes("from executorch.backends.vulkan import utils\nlimits = utils.DEFAULT_TEXTURE_LIMITS\nd = {}\nd['a'] = 1\n") == []


def test_lowering_context_undoes_both_patches_even_on_error():
    import executorch.backends.vulkan.patterns as vk_patterns

    from edgeplug_vulkan_delegate.patches import lowering_context

    search, entry = vk_patterns.get_all_fusable_subgraphs, vk_patterns.fusable_patterns["rms_norm"]

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with lowering_context():
            assert "rms_norm" not in vk_patterns.fusable_patterns  # executorch's own RMSNorm fusion is off
            assert vk_patterns.get_all_fusable_subgraphs is not search  # the search is memoized
            raise Boom
    assert vk_patterns.get_all_fusable_subgraphs is search
    assert vk_patterns.fusable_patterns["rms_norm"] is entry
