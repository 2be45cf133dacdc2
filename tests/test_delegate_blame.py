"""An error raised in a backend's own delegate code is that backend's: the report names the plugin, and the file
and line of the delegate's code, not ExecuTorch (whose ``to_backend`` called it) nor "unknown code".

The delegate here lives in a vendor's package of its own (``vendor_npu``, not the plugin's distribution), as a
vendor SDK's ``BackendDetails`` does: before, its preprocess raising was reported as "executorch's" error.
"""

from __future__ import annotations

import pytest

import edgeplug
from edgeplug.examples import load_model
from edgeplug.testing import write_distribution

VENDOR = '''
from executorch.exir.backend.backend_details import BackendDetails


class VendorNpuBackend(BackendDetails):
    @staticmethod
    def preprocess(edge_program, compile_specs):
        raise ValueError("vendor compiler: unsupported param type")  # the line named
'''

HOOKS = '''
from edgeplug.plugin import BackendSpec, hookimpl


def _partitioner():
    import torch
    import vendor_npu  # registers VendorNpuBackend
    from edgeplug.plugin import SupportTablePartitioner

    return SupportTablePartitioner("VendorNpuBackend", [torch.ops.aten.linear.default, torch.ops.aten.addmm.default,
                                                         torch.ops.aten.permute_copy.default], name="vendornpu")


@hookimpl
def edgeplug_backends():
    yield BackendSpec(backend="vendornpu", description="a vendor's delegate", backend_id="VendorNpuBackend",
                      partitioner=_partitioner)
'''


def test_a_delegates_preprocess_error_names_the_backends_plugin_and_line(edgeplug_site, edgeplug_plain_env, tmp_path):
    write_distribution(tmp_path, "vendor-npu-sdk", files={"vendor_npu.py": VENDOR}, entry_points={}, requires=())
    write_distribution(tmp_path, "edgeplug-vendornpu", files={"edgeplug_vendornpu.py": HOOKS},
                       entry_points={"vendornpu": "edgeplug_vendornpu"})
    edgeplug_site(tmp_path)
    model, inputs, _, _ = load_model("mlp")
    with pytest.raises(edgeplug.LoweringError) as err:
        edgeplug.lower(model, inputs, "vendornpu")
    message = str(err.value)
    assert "vendor compiler: unsupported param type" in message
    assert "in plugin 'vendornpu'" in message and f"{tmp_path / 'vendor_npu.py'}:" in message, message
    assert "executorch's own" not in message and "unknown code" not in message, message
