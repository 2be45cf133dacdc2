"""``edgeplug new-backend NAME``: a plugin package an author starts from.

Writes ``edgeplug-NAME/`` with a pyproject (the entry point, a dependency on
edgeplug, a ``test`` extra pulling ``edgeplug[testing]``), a hooks module
implementing every hook (the ones with nothing to say yet yield nothing, with
a comment saying what they are for), and a test module that runs the
conformance suite for the backend. As generated it installs and its tests
pass; docs/writing-a-backend.md explains each part.

A partitioner whose constructor needs arguments (a compile spec) is built with
the arguments the author gives (``--partitioner-args``, the names they use
imported with ``--import``); the generator reads the constructor's signature
and refuses to write a factory that would call it without them. A name an
installed plugin already has (its distribution, entry point or backend) is
refused: a second plugin of that name would conflict with it.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import keyword
import re
from importlib import metadata
from pathlib import Path
from typing import Mapping, Optional, Sequence

from edgeplug import __version__
from edgeplug._api import API_VERSION
from edgeplug._errors import EdgeplugError
from edgeplug._executorch import TESTED_RANGE

#: partitioners the generator knows by a short name: (import line, expression, backend_id)
KNOWN_PARTITIONERS = {
    "xnnpack": (
        "from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner",
        "XnnpackPartitioner()",
        "XnnpackBackend",
    ),
    "vulkan": (
        "from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner",
        "VulkanPartitioner()",
        "VulkanBackend",
    ),
}

#: the partitioner a new plugin starts from when none is named
DEFAULT_PARTITIONER = "xnnpack"
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def _module_and_name(spec: str, what: str, example: str) -> tuple[str, str]:
    module, _, name = spec.partition(":")
    if not module or not name.isidentifier() or not all(p.isidentifier() for p in module.split(".")):
        raise EdgeplugError(f"{what} {spec!r} is not MODULE:NAME (e.g. {example})")
    return module, name


def _constructor(module: str, cls: str) -> tuple[Optional[inspect.Signature], str]:
    """(the signature of ``module.cls``, '') or (None, why it cannot be read in this environment)."""
    try:
        return inspect.signature(getattr(importlib.import_module(module), cls)), ""
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"


def unchecked_constructor(spec: str, args: Optional[str] = None) -> str:
    """Why the generator cannot check the arguments of partitioner ``spec`` here ('' where it can)."""
    if spec in KNOWN_PARTITIONERS or ":" not in spec or args is not None:
        return ""
    module, cls = spec.split(":", 1)
    signature, why = _constructor(module, cls)
    if signature is not None:
        return ""
    return (
        f"could not import {spec} to check what its constructor requires ({why}); the generated factory "
        f"calls {cls}(): where it needs arguments (a compile spec), give them with --partitioner-args"
    )


def _required_parameters(module: str, cls: str) -> Optional[list[str]]:
    """The parameters ``module.cls(...)`` cannot be called without, or None where the class cannot be read
    here (not importable in this environment: then nothing is checked)."""
    signature, _ = _constructor(module, cls)
    if signature is None:
        return None
    params = signature.parameters.values()
    return [
        p.name for p in params
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def _call_arguments(text: str, imported: set[str], cls: str) -> str:
    """``text`` checked as the arguments of one call whose every free name is imported."""
    try:
        call = ast.parse(f"f({text})", mode="eval").body
    except SyntaxError as exc:
        raise EdgeplugError(
            f"--partitioner-args {text!r} is not the arguments of a Python call ({exc.msg}); give them as you "
            f"would write them inside {cls}(...), e.g. --partitioner-args \"compile_spec=MySpec('fp16')\""
        ) from None
    if not isinstance(call, ast.Call):
        raise EdgeplugError(f"--partitioner-args {text!r} is not the arguments of one call")
    free = sorted({
        n.id for n in ast.walk(call) if isinstance(n, ast.Name) and n.id != "f"
        and n.id not in imported and not hasattr(builtins, n.id)
    })
    if free:
        raise EdgeplugError(
            f"--partitioner-args uses {', '.join(free)}, which nothing imports: add --import MODULE:NAME for each "
            f"(e.g. --import my_npu.compile_spec:{free[0]})"
        )
    return text


def _partitioner(
    spec: str, backend_id: Optional[str], args: Optional[str] = None, imports: Sequence[str] = ()
) -> tuple[str, str, str]:
    """(import lines, the call that builds the partitioner, backend_id)."""
    lines = [
        "from {} import {}".format(*_module_and_name(i, "--import", "my_npu.compile_spec:MyCompileSpec"))
        for i in imports
    ]
    imported = {line.rsplit(" ", 1)[1] for line in lines}
    if spec in KNOWN_PARTITIONERS:
        imp, expr, bid = KNOWN_PARTITIONERS[spec]
        cls = expr.split("(")[0]
        call = f"{cls}({_call_arguments(args, imported, cls)})" if args else expr
        return "\n    ".join([imp, *lines]), call, backend_id or bid
    if ":" not in spec:
        known = ", ".join(KNOWN_PARTITIONERS)
        raise EdgeplugError(
            f"--partitioner {spec!r} is neither a known one ({known}) nor MODULE:CLASS "
            "(e.g. my_npu.partition:MyPartitioner)"
        )
    module, cls = _module_and_name(spec, "--partitioner", "my_npu.partition:MyPartitioner")
    if not backend_id:
        raise EdgeplugError(
            f"--partitioner {spec} needs --backend-id: the id the partitioner's DelegationSpec tags "
            "partitions with (its preprocess backend's class name, e.g. MyNpuBackend)"
        )
    required = _required_parameters(module, cls)
    if required and args is None:
        raise EdgeplugError(
            f"{cls} cannot be built without arguments: its constructor requires {', '.join(required)} (no "
            f"default), so a factory calling {cls}() would fail in every lowering. Give them with "
            f"--partitioner-args, as you would write them inside {cls}(...), and import the names they use with "
            f"--import MODULE:NAME, e.g. --partitioner-args \"{required[0]}=...\" --import MODULE:NAME; they go "
            "into the generated factory (_partitioner in hooks.py), which you can change later"
        )
    call = f"{cls}({_call_arguments(args, imported | {cls}, cls) if args else ''})"
    return "\n    ".join([f"from {module} import {cls}", *lines]), call, backend_id


def _installed_distribution(dist: str) -> Optional[str]:
    """``dist VERSION`` where a distribution of that name is installed, else None."""
    try:
        return f"{dist} {metadata.version(dist)}"
    except metadata.PackageNotFoundError:
        return None


def _entry_point_owner(name: str) -> Optional[str]:
    """The distribution whose ``edgeplug`` entry point is named ``name``, else None."""
    for ep in metadata.entry_points(group="edgeplug"):
        if ep.name == name:
            dist = getattr(ep, "dist", None)
            return f"{dist.name} {dist.version}" if dist is not None else f"the entry point {ep.value}"
    return None


def check_name_is_free(name: str, backends: Mapping[str, str] = {}) -> None:
    """Refuse a name an installed plugin already has: its distribution ``edgeplug-NAME``, an entry point
    ``NAME`` of the ``edgeplug`` group, or a backend ``NAME`` (``backends``: backend -> its distribution,
    from the registry the caller reads)."""
    dist = f"edgeplug-{name.replace('_', '-')}"
    taken = []
    if name in backends:
        taken.append(f"backend {name!r} is registered by {backends[name]}")
    owner = _entry_point_owner(name)
    if owner:
        taken.append(f"the plugin entry point {name!r} is {owner}'s")
    installed = _installed_distribution(dist)
    if installed:
        taken.append(f"the distribution it would be, {dist}, is installed ({installed})")
    if taken:
        raise EdgeplugError(
            f"the name {name!r} is taken: {'; '.join(taken)}. A second plugin of that name would conflict with "
            f"it (and installing it would replace that distribution). Choose another name, e.g. "
            f"`edgeplug new-backend my{name}`; nothing was written"
        )


#: the generated hooks.py's stubs for every hook but edgeplug_backends (plain text: no placeholders)
_HOOK_STUBS = '''@hookimpl
def edgeplug_keep_whole():
    # ops to_edge must not decompose because the backend runs them whole:
    #   from edgeplug.plugin import KeepWhole
    #   yield KeepWhole(backend=BACKEND, ops=(torch.ops.aten.linear.default,))
    return ()


@hookimpl
def edgeplug_partitioner_filters():
    # per-node refusals with a reason, on edge ops (exir_ops.edge.aten.div.Tensor):
    #   from edgeplug.plugin import PartitionerFilter
    #   yield PartitionerFilter(backend=BACKEND, name="no-div", fn=no_div)
    return ()


@hookimpl
def edgeplug_fusion_policies():
    # what an RMSNorm match becomes (only if the backend delegates the fused op):
    #   from edgeplug.plugin import FusionPolicy
    #   yield FusionPolicy(backend=BACKEND, target="aten.rms_norm")
    return ()


@hookimpl
def edgeplug_kernels():
    # host kernels for ops inside the delegate (verify_method="kernels"):
    #   from edgeplug.plugin import Kernel
    #   yield Kernel(backend=BACKEND, op="my_ns.my_op.default", impl=my_op, device="cpu")
    return ()


@hookimpl
def edgeplug_passes():
    # graph passes at the "export" (aten), "edge" (before the core's fusion) or "pre_partition"
    # (after it) stage, ordered by before/after:
    #   from edgeplug.plugin import PassSpec
    #   yield PassSpec(backend=BACKEND, stage="export", name="my_pass", fn=my_pass)
    # the core's exact rewrites into ops your partitioner takes (docs/writing-a-backend.md):
    #   from edgeplug.plugin import rewrite_pass
    #   yield rewrite_pass("scalar_to_tensor", backend=BACKEND)
    return ()


@hookimpl
def edgeplug_quantizers():
    # PT2E schemes for edgeplug.quantize / lower --quantize:
    #   from edgeplug.plugin import QuantScheme
    #   yield QuantScheme(backend=BACKEND, scheme="8a8w", factory=make_quantizer, ...)
    return ()
'''


def _pyproject(name: str, pkg: str, dist: str, version: str) -> str:
    __version__ = version
    # hatchling builds from the sources as they are: `pip install .` leaves no build/ or
    # *.egg-info in the author's checkout (setuptools writes both into it)
    return f'''[build-system]
requires = ["hatchling>=1.26"]
build-backend = "hatchling.build"

[project]
name = "{dist}"
version = "0.1.0"
description = "edgeplug backend: {name}"
requires-python = ">=3.10"
# the ExecuTorch releases this plugin is tested with: `edgeplug plugins` shows the range, and warns outside it
dependencies = ["edgeplug>={__version__}", "executorch{TESTED_RANGE}"]

[project.optional-dependencies]
# pytest and the conformance suite's fixtures: pip install -e '.[test]'
test = ["edgeplug[testing]>={__version__}"]

[project.entry-points.edgeplug]
{name} = "{pkg}.hooks"

[tool.hatch.build.targets.wheel]
packages = ["{pkg}"]

[tool.pytest.ini_options]
testpaths = ["tests"]
'''


def _readme(name: str, dist: str, verify: str) -> str:
    if verify == "none":
        lower = (
            f"edgeplug lower handwritten-llama-decoder --backend {name} -o llama.pte   # verify_method \"none\": no runtime here,\n"
            "                                   # so check the .pte on the device (--verify is refused)"
        )
    else:
        lower = f"edgeplug lower handwritten-llama-decoder --backend {name} --verify   # runs the .pte, compares with eager"
    return f'''# {dist}

An [edgeplug](https://pypi.org/project/edgeplug/) backend. Install it next to
edgeplug and it is a backend:

```sh
pip install -e '.[test]'
edgeplug plugins                   # {name}: loaded, and what it adds
edgeplug lower handwritten-llama-decoder --backend {name} --dry-run   # the partitions, no .pte
{lower}
pytest                             # the conformance suite for {name}
```
'''


def _hooks_module(name: str, imp: str, expr: str, bid: str, verify: str) -> str:
    """The generated ``edgeplug_NAME/hooks.py``: the backend's spec, and every other hook stubbed."""
    return f'''"""Hook implementations of the {name!r} backend (generated by `edgeplug new-backend`).

Every hook is here; the ones yielding nothing yet say what they are for.
docs/writing-a-backend.md in edgeplug's repository has the contract of each.
"""

from __future__ import annotations

from edgeplug.plugin import BackendSpec, hookimpl

BACKEND = "{name}"


def _partitioner():
    {imp}

    return {expr}


@hookimpl
def edgeplug_backends():
    yield BackendSpec(
        backend=BACKEND,
        description="{name} (generated by edgeplug new-backend)",
        # the id the partitioner tags its partitions with, and the .pte's delegate names
        backend_id="{bid}",
        partitioner=_partitioner,
        # how edgeplug.verify runs a lowered program here: "pte" (executorch's
        # Python runtime runs the delegate), "kernels" (edgeplug_kernels on the
        # host) or "none"
        verify_method="{verify}",
        # the plugin API this package was written for (edgeplug.plugin.API_VERSION when it was generated):
        # a later edgeplug that changes the API warns about, or refuses, what this package spells the old way
        api_version={API_VERSION},
    )


{_HOOK_STUBS}'''


def render(
    name: str,
    partitioner: str = DEFAULT_PARTITIONER,
    backend_id: Optional[str] = None,
    *,
    partitioner_args: Optional[str] = None,
    imports: Sequence[str] = (),
) -> dict[str, str]:
    """The files of the plugin package ``edgeplug-NAME``: relative path -> text.

    ``partitioner_args``: the partitioner's constructor arguments as Python source (``"compile_spec=Spec('fp16')"``),
    required where its constructor has parameters without defaults; ``imports``: ``MODULE:NAME`` for each name
    they use.
    """
    if not _NAME.match(name) or keyword.iskeyword(name):
        raise EdgeplugError(
            f"backend name {name!r} must be lower-case letters, digits or '_', starting with a letter "
            "(it becomes the module edgeplug_NAME and the entry point NAME)"
        )
    imp, expr, bid = _partitioner(partitioner, backend_id, partitioner_args, imports)
    pkg = f"edgeplug_{name}"
    dist = f"edgeplug-{name.replace('_', '-')}"
    verify = "pte" if bid == "XnnpackBackend" else "none"
    files = {
        "pyproject.toml": _pyproject(name, pkg, dist, __version__),
        f"{pkg}/__init__.py": f'"""The edgeplug backend {name!r}: hooks in {pkg}.hooks."""\n',
        f"{pkg}/hooks.py": _hooks_module(name, imp, expr, bid, verify),
        "tests/test_backend.py": f'''"""The conformance suite every edgeplug backend passes, for {name!r}; add your own tests below."""

from edgeplug.testing.conformance import *  # noqa: F401,F403

EDGEPLUG_BACKENDS = ["{name}"]

# A conformance test the backend cannot pass for a reason outside this plugin (a bug of the backend's own
# library), by name and with why: the run shows it skipped with that reason (docs/writing-a-backend.md,
# "The conformance suite", lists every test):
# EDGEPLUG_CONFORMANCE_OPT_OUT = {{"test_llm_custom_ops_are_delegated_or_named": "upstream issue NNNN: ..."}}
''',
        "README.md": _readme(name, dist, verify),
    }
    return files


def write(
    name: str,
    dest: str | Path,
    partitioner: str = DEFAULT_PARTITIONER,
    backend_id: Optional[str] = None,
    *,
    partitioner_args: Optional[str] = None,
    imports: Sequence[str] = (),
    backends: Mapping[str, str] = {},
) -> Path:
    """Write the package into ``dest/edgeplug-NAME`` (refusing to overwrite, and refusing a name an installed
    plugin has: ``backends`` maps the registered backends to their distributions); returns that folder."""
    check_name_is_free(name, backends)
    files = render(name, partitioner, backend_id, partitioner_args=partitioner_args, imports=imports)
    root = Path(dest) / f"edgeplug-{name.replace('_', '-')}"
    if root.exists():
        raise EdgeplugError(f"{root} exists; choose another --output folder or remove it first")
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
