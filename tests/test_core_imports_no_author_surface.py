"""The core does not import the plugin-author surface: ``edgeplug.plugin`` sits above it.

``edgeplug.plugin`` re-exports names from the core's private modules for
backend authors; a core module that imported it back would make the author
surface a dependency of what it publishes (host verification once read
``edgeplug.plugin.gpu_device``; the device cache is ``edgeplug._runtime.process`` now).
Only the packages written for plugin authors and their tests may import it:
``edgeplug.testing`` (the conformance suite) and ``edgeplug.examples``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "core" / "edgeplug"
#: modules written for plugin authors, which use the surface as a plugin does
ABOVE = ("plugin.py", "testing/", "examples/")


def _imports_of_plugin_surface(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "edgeplug.plugin":
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "edgeplug":
            if any(a.name == "plugin" for a in node.names):
                lines.append(node.lineno)
        elif isinstance(node, ast.Import) and any(a.name == "edgeplug.plugin" for a in node.names):
            lines.append(node.lineno)
    return lines


def test_no_core_module_imports_edgeplug_plugin():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(ABOVE):
            continue
        for line in _imports_of_plugin_surface(ast.parse(path.read_text(), str(path))):
            found.append(f"edgeplug/{rel}:{line}")
    assert not found, (
        f"core modules import the plugin-author surface edgeplug.plugin at {', '.join(found)}: import the name "
        "from the private module that defines it (edgeplug.plugin's _LAZY table says which)"
    )


def test_the_check_sees_each_spelling():
    spellings = ["from edgeplug.plugin import gpu_device", "from edgeplug import plugin", "import edgeplug.plugin"]
    for text in spellings:
        assert _imports_of_plugin_surface(ast.parse(text)) == [1], text
    inside = "def f():\n    from edgeplug.plugin import gpu_device\n"
    assert _imports_of_plugin_surface(ast.parse(inside)) == [2]
    assert _imports_of_plugin_surface(ast.parse('"""from edgeplug.plugin import x"""')) == []


def test_gpu_device_of_the_author_surface_is_the_cores_one():
    import edgeplug._runtime.process
    import edgeplug.plugin

    assert edgeplug.plugin.gpu_device is edgeplug._runtime.process.gpu_device
