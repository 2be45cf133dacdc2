"""`edgeplug backends` lists what is installed without importing executorch: it builds no partitioner and opens no
wgpu adapter unless asked (``--probe``, ``--adapter``), and no package __init__ of the core pulls executorch in.

Before, the listing took 15-20 s even with no plugin installed: the registry's read of ``edgeplug._graph.ops`` loaded
``edgeplug._graph`` (and with it ``executorch.exir``), a filter's ``edgeplug.plugin.refuse`` loaded the whole partition
package, the runtime lines loaded the verification package, and every available backend's partitioner was built.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from edgeplug.testing import write_distribution

HOOKS = """
from edgeplug.plugin import BackendSpec, KeepWhole, PartitionerFilter, hookimpl, refuse


def _partitioner():  # executorch is imported here, as the guide asks, not when the plugin loads
    import torch
    from edgeplug.plugin import SupportTablePartitioner

    return SupportTablePartitioner("QuickBackend", [torch.ops.aten.add.Tensor], name="quick")


def _no_div(node, ctx):
    return refuse("no divide") if "div" in str(node.target) else None


@hookimpl
def edgeplug_backends():
    yield BackendSpec(backend="quick", description="a plugin that imports executorch lazily",
                      backend_id="QuickBackend", partitioner=_partitioner, verify_method="kernels")


@hookimpl
def edgeplug_keep_whole():
    import torch

    yield KeepWhole(backend="quick", ops=(torch.ops.aten.linear.default,))


@hookimpl
def edgeplug_partitioner_filters():
    yield PartitionerFilter(backend="quick", name="no-div", fn=_no_div)
"""

SCRIPT = """
import sys
from edgeplug._cli import main
code = main(sys.argv[1:])
heavy = sorted(m for m in ("executorch.exir", "wgpu") if m in sys.modules)
print("HEAVY:", ",".join(heavy) or "none")
sys.exit(code)
"""


def _backends(site: Path, *args: str) -> subprocess.CompletedProcess:
    write_distribution(site, "edgeplug-quick", files={"edgeplug_quick.py": HOOKS}, entry_points={"quick": "edgeplug_quick"})
    env = dict(os.environ, PYTHONPATH=str(site), EDGEPLUG_PLUGINS="quick")  # this plugin only
    env.pop("EDGEPLUG_DISABLE_PLUGINS", None)
    env.pop("EDGEPLUG_REGISTER_PLUGINS", None)
    return subprocess.run([sys.executable, "-c", SCRIPT, "backends", *args], env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_listing_imports_no_executorch_and_opens_no_adapter(tmp_path):
    proc = _backends(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[1].split()[:4] == ["quick", "edgeplug-quick", "0.1.0", "kernels"], proc.stdout
    assert "wgpu adapter" not in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY: none", proc.stdout


def test_probe_and_adapter_do_the_deep_checks(tmp_path):
    proc = _backends(tmp_path, "--probe", "--adapter")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "wgpu adapter: " in proc.stdout
    assert "executorch.exir" in proc.stdout.strip().splitlines()[-1], proc.stdout  # the partitioner was built
