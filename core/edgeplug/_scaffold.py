"""``edgeplug new-backend NAME``: a plugin package an author starts from.

Writes ``edgeplug-NAME/`` with a pyproject (the entry point, a dependency on
edgeplug, a ``test`` extra pulling ``edgeplug[testing]``), a hooks module
implementing every hook (the ones with nothing to say yet yield nothing, with
a comment saying what they are for), and a test module that runs the
conformance suite for the backend. As generated it installs and its tests
pass; docs/writing-a-backend.md explains each part.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path
from typing import Optional

from edgeplug import __version__
from edgeplug._errors import EdgeplugError

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


def _partitioner(spec: str, backend_id: Optional[str]) -> tuple[str, str, str]:
    if spec in KNOWN_PARTITIONERS:
        imp, expr, bid = KNOWN_PARTITIONERS[spec]
        return imp, expr, backend_id or bid
    module, _, cls = spec.partition(":")
    if not module or not cls.isidentifier() or not all(p.isidentifier() for p in module.split(".")):
        known = ", ".join(KNOWN_PARTITIONERS)
        raise EdgeplugError(
            f"--partitioner {spec!r} is neither a known one ({known}) nor MODULE:CLASS "
            "(e.g. my_npu.partition:MyPartitioner)"
        )
    if not backend_id:
        raise EdgeplugError(
            f"--partitioner {spec} needs --backend-id: the id the partitioner's DelegationSpec tags "
            "partitions with (its preprocess backend's class name, e.g. MyNpuBackend)"
        )
    return f"from {module} import {cls}", f"{cls}()", backend_id


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
dependencies = ["edgeplug>={__version__}"]

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


def render(name: str, partitioner: str = DEFAULT_PARTITIONER, backend_id: Optional[str] = None) -> dict[str, str]:
    """The files of the plugin package ``edgeplug-NAME``: relative path -> text."""
    if not _NAME.match(name) or keyword.iskeyword(name):
        raise EdgeplugError(
            f"backend name {name!r} must be lower-case letters, digits or '_', starting with a letter "
            "(it becomes the module edgeplug_NAME and the entry point NAME)"
        )
    imp, expr, bid = _partitioner(partitioner, backend_id)
    pkg = f"edgeplug_{name}"
    dist = f"edgeplug-{name.replace('_', '-')}"
    verify = "pte" if bid == "XnnpackBackend" else "none"
    files = {
        "pyproject.toml": _pyproject(name, pkg, dist, __version__),
        f"{pkg}/__init__.py": f'"""The edgeplug backend {name!r}: hooks in {pkg}.hooks."""\n',
        f"{pkg}/hooks.py": f'''"""Hook implementations of the {name!r} backend (generated by `edgeplug new-backend`).

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
    )


{_HOOK_STUBS}''',
        "tests/test_backend.py": f'''"""The conformance suite every edgeplug backend passes, for {name!r}; add your own tests below."""

from edgeplug.testing.conformance import *  # noqa: F401,F403

EDGEPLUG_BACKENDS = ["{name}"]
''',
        "README.md": _readme(name, dist, verify),
    }
    return files


def write(name: str, dest: str | Path, partitioner: str = DEFAULT_PARTITIONER, backend_id: Optional[str] = None) -> Path:
    """Write the package into ``dest/edgeplug-NAME`` (refusing to overwrite); returns that folder."""
    files = render(name, partitioner, backend_id)
    root = Path(dest) / f"edgeplug-{name.replace('_', '-')}"
    if root.exists():
        raise EdgeplugError(f"{root} exists; choose another --output folder or remove it first")
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
