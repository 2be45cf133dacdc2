"""Every reach into ExecuTorch's internals lives in one module: ``edgeplug._executorch`` in the core, and one
``_executorch.py`` per plugin package (issue 43). Anywhere else in the shipped code (the core and every
plugin package, tests aside) a reach fails this test, with its file, line and what it reached:

- importing an underscored ExecuTorch module, or an underscored name from an ExecuTorch module;
- reading an underscored attribute of something imported from ExecuTorch, or replacing or mutating anything
  imported from ExecuTorch (assignment, ``del``, ``setattr``, ``.pop()``/``.update()``... on it);
- ``getattr``/``hasattr``/``setattr`` with an underscored literal name, or a ``meta["_..."]`` key, unless the name
  is one of the few torch attributes listed below (torch's, not ExecuTorch's);
- reading an attribute by an underscored name that ExecuTorch's own sources define (``x._op``,
  ``program._tensor_data``), on anything but ``self``/``cls``, unless the project defines that name itself;
- passing an underscored keyword to something imported from ExecuTorch (``EdgeCompileConfig(_core_aten_ops_...=)``),
  except the IR check's switch ``_check_ir_validity``, which ExecuTorch's own documentation tells users to set;
- reading a data file of the executorch package (``importlib.resources.files("executorch")``): its layout is no API.

``python tests/test_executorch_boundary.py`` prints every reach found.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: torch's private attributes the core reads (they are torch's, and torch's boundary is another matter)
TORCH_PRIVATE = frozenset({
    "_opname", "_overloadname", "_schema", "_erased", "_graph_namespace", "_used_names", "_nondeterministic_seeded",
})
#: underscored keywords of ExecuTorch's that its documentation hands users (not a reach)
DOCUMENTED_KEYWORDS = frozenset({"_check_ir_validity"})
MUTATORS = frozenset({"pop", "popitem", "update", "clear", "setdefault", "__setitem__", "__delitem__", "append", "remove"})


def shipped_modules() -> list[Path]:
    core = sorted((ROOT / "core" / "edgeplug").rglob("*.py"))
    plugins = sorted(p for p in (ROOT / "plugins").glob("*/edgeplug_*/**/*.py") if "tests" not in p.parts)
    return core + plugins


def is_boundary(path: Path) -> bool:
    return path.name == "_executorch.py"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _from_executorch(module: str | None) -> bool:
    return bool(module) and (module == "executorch" or module.startswith("executorch."))


@functools.lru_cache(maxsize=1)
def executorch_private_names() -> frozenset[str]:
    """The underscored attribute and method names ExecuTorch's installed sources define."""
    try:
        import executorch
    except ImportError:
        return frozenset()
    names: set[str] = set()
    pattern = re.compile(r"(?:self\.(_[A-Za-z]\w*)\s*[:=]|^\s+def (_[A-Za-z]\w*)\()", re.M)
    for path in Path(executorch.__path__[0]).rglob("*.py"):
        if "test" in path.parts or path.name.startswith("test_"):
            continue
        for a, b in pattern.findall(path.read_text(errors="replace")):
            names.add(a or b)
    return frozenset(n for n in names if _private(n))


@functools.lru_cache(maxsize=1)
def own_private_names() -> frozenset[str]:
    """The underscored names the project defines itself (its own attributes are its own business)."""
    names: set[str] = set()
    for path in shipped_modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):  # a method or class attribute of the project's own classes
                names.update(
                    m.name for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(m.name)
                )
                names.update(
                    t.id for m in node.body if isinstance(m, (ast.Assign, ast.AnnAssign))
                    for t in (m.targets if isinstance(m, ast.Assign) else [m.target])
                    if isinstance(t, ast.Name) and _private(t.id)
                )
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr):
                names.add(node.attr)
            elif isinstance(node, ast.arg) and _private(node.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                names.add(node.slice.value)
    return frozenset(names)


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


class _Reaches(ast.NodeVisitor):
    def __init__(self, path: str, foreign: frozenset[str]) -> None:
        self.path, self.foreign, self.bound, self.found = path, foreign, set(), []
        self.op_names: set[int] = set()  # ``ns._to_copy.default``: an op's name, not an attribute

    def _say(self, node: ast.AST, what: str) -> None:
        self.found.append(f"{self.path}:{node.lineno}: {what}")

    def _is_bound(self, node: ast.AST) -> bool:
        root = _root(node)
        return isinstance(root, ast.Name) and root.id in self.bound

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if _from_executorch(alias.name):
                if any(_private(part) for part in alias.name.split(".")):
                    self._say(node, f"imports ExecuTorch's private module {alias.name}")
                self.bound.add(alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if not _from_executorch(node.module):
            return
        if any(_private(part) for part in node.module.split(".")):
            self._say(node, f"imports from ExecuTorch's private module {node.module}")
        for alias in node.names:
            if _private(alias.name):
                self._say(node, f"imports ExecuTorch's private name {alias.name} from {node.module}")
            self.bound.add(alias.asname or alias.name)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Attribute) and node.attr in ("default", "Tensor", "Scalar", "out"):
            self.op_names.add(id(node.value))
        if _private(node.attr) and not isinstance(node.ctx, ast.Store) and id(node) not in self.op_names:
            root = _root(node.value)
            if self._is_bound(node.value):
                self._say(node, f"reads ExecuTorch's private attribute .{node.attr}")
            elif node.attr in self.foreign and not (isinstance(root, ast.Name) and root.id in ("self", "cls")):
                self._say(node, f"reads .{node.attr}, a private name of ExecuTorch's")
        self.generic_visit(node)

    def _store(self, targets: list[ast.AST], node: ast.AST, verb: str) -> None:
        for t in targets:
            if isinstance(t, (ast.Attribute, ast.Subscript)) and self._is_bound(t):
                self._say(node, f"{verb} something of ExecuTorch's ({ast.unparse(t)})")

    def visit_Assign(self, node: ast.Assign) -> None:
        self._store(node.targets, node, "replaces")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._store([node.target], node, "replaces")
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        self._store(node.targets, node, "deletes")
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str) and _private(key.value) \
                and key.value not in TORCH_PRIVATE and key.value not in own_private_names():
            self._say(node, f"reads the private key {key.value!r}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        fn = node.func
        if isinstance(fn, ast.Name) and fn.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) >= 2:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and _private(name.value) \
                    and name.value not in TORCH_PRIVATE and name.value not in own_private_names():
                self._say(node, f"{fn.id}(..., {name.value!r}): a private attribute")
            if fn.id in ("setattr", "delattr") and self._is_bound(node.args[0]):
                self._say(node, f"{fn.id} on something of ExecuTorch's")
        if self._is_bound(fn):
            for kw in node.keywords:
                if kw.arg and _private(kw.arg) and kw.arg not in DOCUMENTED_KEYWORDS:
                    self._say(node, f"passes ExecuTorch's private keyword {kw.arg}= to {ast.unparse(fn)}")
        if isinstance(fn, ast.Attribute) and fn.attr in ("files", "read_text", "read_binary", "path", "open_text") \
                and node.args and isinstance(node.args[0], ast.Constant) and _from_executorch(str(node.args[0].value)):
            self._say(node, f"reads the executorch package's data files ({ast.unparse(fn)}({node.args[0].value!r}))")
        if isinstance(fn, ast.Attribute) and fn.attr in MUTATORS and self._is_bound(fn.value):
            self._say(node, f"mutates something of ExecuTorch's (.{fn.attr}())")
        if isinstance(fn, ast.Attribute) and fn.attr == "get" and node.args:
            key = node.args[0]
            if isinstance(fn.value, ast.Attribute) and fn.value.attr == "meta" and isinstance(key, ast.Constant) \
                    and isinstance(key.value, str) and _private(key.value):
                self._say(node, f"reads the private meta key {key.value!r}")
        self.generic_visit(node)


def reaches(source: str, path: str = "<src>") -> list[str]:
    """Each reach into ExecuTorch's internals in ``source``, as ``path:line: what``."""
    visitor = _Reaches(path, executorch_private_names() - own_private_names() - TORCH_PRIVATE)
    visitor.visit(ast.parse(source, path))
    return visitor.found


def all_reaches() -> list[str]:
    out = []
    for path in shipped_modules():
        if not is_boundary(path):
            out += reaches(path.read_text(), str(path.relative_to(ROOT)))
    return out


def test_no_reach_outside_the_boundary_modules():
    found = all_reaches()
    assert not found, "reaches into ExecuTorch's internals outside the _executorch modules:\n" + "\n".join(found)


def test_each_plugin_reaches_from_one_module_at_most():
    for package in sorted((ROOT / "plugins").glob("*/edgeplug_*")):
        assert len(list(package.rglob("_executorch.py"))) <= 1, package


PLANTED = '''
from executorch.exir._serialize._cord import FileBackedData
from executorch.exir.tracer import _default_decomposition_table
import executorch.exir.emit._emitter as em
from executorch.exir.backend import backend_api
from executorch.backends.somebackend.patterns import fusable_patterns
from executorch.exir import EdgeCompileConfig

backend_api.copy = None
fusable_patterns.pop("rms_norm")
em._Emitter
info = lowered.meta.get("_delegate_info_meta")
inner = getattr(partitioner, "_wrapped_partitioner", partitioner)
inner = node.target._op
ok = EdgeCompileConfig(_check_ir_validity=False)
setattr(backend_api, "x", 1)
strict = EdgeCompileConfig(_check_ir_validity=True, _core_aten_ops_exception_list=[])
text = resources.files("executorch.kernels").joinpath("functions.yaml").read_text()
'''


def test_the_checker_finds_planted_reaches():
    found = reaches(PLANTED)
    lines = sorted({int(f.split(":")[1]) for f in found})
    # every planted line but the public imports and the public config's keyword
    assert lines == [2, 3, 4, 9, 10, 11, 12, 13, 14, 16, 17, 18], found
    assert not any("_check_ir_validity" in f for f in found), "the documented switch is public use"
    assert any("_wrapped_partitioner" in f for f in found)
    assert any("._op" in f for f in found), "a private name of ExecuTorch's read on an edge op is a reach"


def test_the_checker_leaves_public_use_alone():
    clean = '''
from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
from executorch.backends.somebackend.partition import SomePartitioner

class Mine:
    def __init__(self):
        self._weights = None
    def run(self):
        return self._weights

edge = to_edge_transform_and_lower(ep, partitioner=[SomePartitioner()], compile_config=EdgeCompileConfig())
name = getattr(target, "_overloadname", "")
'''
    assert reaches(clean) == []


if __name__ == "__main__":
    print("\n".join(all_reaches()) or "no reach outside the boundary modules")
    sys.exit(0)
