"""A complete edgeplug backend in one module.

This is the template for a third-party backend: a ``BackendSpec`` that names
an executorch partitioner, and an entry point in ``pyproject.toml``::

    [project.entry-points.edgeplug]
    xnnpack = "edgeplug_xnnpack.hooks"

XNNPACK runs in executorch's own Python runtime, so ``verify_method="pte"``: the
core executes the real .pte and compares it against eager.
"""

from __future__ import annotations

import edgeplug
from edgeplug import BackendSpec


def _partitioner():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner()


@edgeplug.hookimpl
def edgeplug_backends():
    yield BackendSpec(
        backend="xnnpack",
        description="XNNPACK on the CPU (runs in executorch's Python runtime)",
        backend_id="XnnpackBackend",
        partitioner=_partitioner,
        verify_method="pte",
    )


def _symmetric_per_channel():
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))


@edgeplug.hookimpl
def edgeplug_quantizers():
    yield edgeplug.QuantScheme(
        backend="xnnpack", scheme="8a8w", factory=_symmetric_per_channel, activation_bits=8, weight_bits=8,
        per_channel=True, description="8-bit activations, 8-bit symmetric per-channel weights (XNNPACKQuantizer)",
    )
