"""The xnnpack backend, the template third-party plugin: the conformance suite, and running its .pte."""

from __future__ import annotations

from importlib.metadata import distribution

import edgeplug
from edgeplug.testing.conformance import *  # noqa: F401,F403

EDGEPLUG_BACKENDS = ["xnnpack"]


def test_a_third_party_plugin_needs_one_module_and_one_entry_point():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    xnnpack = edgeplug.get_backend("xnnpack")
    assert type(xnnpack.make_partitioner()) is XnnpackPartitioner
    assert (xnnpack.spec.backend_id, xnnpack.spec.verify_method) == ("XnnpackBackend", "pte")
    dist = distribution("edgeplug-xnnpack")
    assert [r.split("=")[0] for r in dist.requires] == ["edgeplug"]  # the core and nothing else
    assert [(e.name, e.value) for e in dist.entry_points if e.group == "edgeplug"] == [("xnnpack", "edgeplug_xnnpack.hooks")]


def test_runs_its_pte_in_executorchs_runtime(edgeplug_lowering):
    report = edgeplug_lowering("mlp", "xnnpack", verify=True).report
    assert report.verification.method == "pte"
    assert report.verification.adapter == "executorch runtime (host CPU)"
    assert report.verification.max_abs_diff < 1e-4
