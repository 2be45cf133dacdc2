"""The conformance suite over every installed backend, and the suite itself.

The suite lives in ``edgeplug.testing.conformance`` so third-party plugins run
the same checks; importing its tests here runs them for every backend
installed with the core.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import edgeplug
from edgeplug.testing import conformance
from edgeplug.testing.conformance import *  # noqa: F401,F403  (the suite, over every backend)

FIXTURES = Path(__file__).resolve().parent / "fixtures"

#: DESIGN.md's fusion-policy table for the first-party backends
POLICIES = {
    "coreml": ("aten.rms_norm", False),
    "qnn": ("aten.rms_norm", False),
    "samsung": ("aten.rms_norm", False),
    "vulkan": ("et_vk.rms_norm", False),
    "webgpu": ("et_vk.rms_norm", True),
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_first_party_fusion_policies_follow_the_design_table(name):
    target, fp32 = POLICIES[name]
    policy = edgeplug.get_backend(name).fusion_policy("rms_norm")
    assert policy is not None, f"{name} declares no rms_norm fusion policy"
    assert policy.target == target
    assert policy.weight_sources == frozenset({"leaf"})
    assert policy.fold_computed_constants and policy.unit_weight_fallback
    assert policy.fp32_accumulation is fp32


def test_suite_selects_every_installed_backend(request):
    from edgeplug.testing.plugin import selected_backends

    if request.config.getoption("--edgeplug-backend"):
        pytest.skip("backends selected on the command line")
    assert set(selected_backends(request.config)) >= {"qnn", "samsung", "vulkan", "webgpu", "xnnpack"}


# -- the suite catches what it promises to catch ------------------------------------


def _spec(**overrides):
    fields = dict(backend="sloppy", description="x", backend_id="XnnpackBackend", partitioner=list)
    fields.update(overrides)
    return edgeplug.BackendSpec(**fields)


def test_suite_fails_a_backend_whose_partitioner_is_not_an_executorch_partitioner(edgeplug_register):
    class Sloppy:
        @edgeplug.hookimpl
        def edgeplug_backends(self):
            yield _spec()

    edgeplug_register(Sloppy(), name="sloppy")
    with pytest.raises(AssertionError, match="returned list, not an executorch Partitioner"):
        conformance.test_backend_spec(edgeplug.get_backend("sloppy"))


def test_suite_fails_an_unavailable_backend_that_does_not_say_what_to_do(edgeplug_register):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    class Mute:
        @edgeplug.hookimpl
        def edgeplug_backends(self):
            yield _spec(partitioner=XnnpackPartitioner, availability=lambda: edgeplug.Availability(ok=False, reason="no"))

    edgeplug_register(Mute(), name="mute")
    with pytest.raises(AssertionError, match=r"must say what to do \(Availability.hint\)"):
        conformance.test_backend_spec(edgeplug.get_backend("sloppy"))


def test_suite_fails_records_for_a_backend_nobody_registers(edgeplug_register):
    class Typo:
        @edgeplug.hookimpl
        def edgeplug_backends(self):
            yield _spec()

        @edgeplug.hookimpl
        def edgeplug_fusion_policies(self):
            yield edgeplug.FusionPolicy(backend="slopy", target="aten.rms_norm")

    edgeplug_register(Typo(), name="typo")
    with pytest.raises(AssertionError, match="FusionPolicy for backend 'slopy', which no loaded plugin registers .*Did you mean 'sloppy'"):
        conformance.test_records_validate_and_name_a_backend(edgeplug.get_backend("sloppy"))


def test_suite_fails_a_fusion_policy_naming_no_operator(edgeplug_register):
    class Unknown:
        @edgeplug.hookimpl
        def edgeplug_backends(self):
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

            yield _spec(partitioner=XnnpackPartitioner)

        @edgeplug.hookimpl
        def edgeplug_fusion_policies(self):
            # a load_target defers the check to the suite (a target without one is refused at load)
            yield edgeplug.FusionPolicy(backend="sloppy", target="my_npu.rms_norm", load_target=lambda: None)

    edgeplug_register(Unknown(), name="unknown")
    with pytest.raises(AssertionError, match=r"'my_npu.rms_norm' is not a registered operator"):
        conformance.test_fusion_policy(edgeplug.get_backend("sloppy"))


# -- a third party runs the suite ----------------------------------------------------


def test_suite_fails_a_kernel_for_an_op_that_does_not_exist(edgeplug_register):
    class Ghost:
        @edgeplug.hookimpl
        def edgeplug_backends(self):
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

            yield _spec(partitioner=XnnpackPartitioner)

        @edgeplug.hookimpl
        def edgeplug_kernels(self):
            # a namespace no library registered at load: accepted then, refused by the suite
            yield edgeplug.Kernel(backend="sloppy", op="my_npu_ops.gelu.default", impl=print, device="cpu")

    edgeplug_register(Ghost(), name="ghost")
    with pytest.raises(AssertionError, match=r"kernel op 'my_npu_ops.gelu.default' of backend 'sloppy' is not a registered operator"):
        conformance.test_kernels_name_registered_ops(edgeplug.get_backend("sloppy"))


def test_plugin_author_runs_the_suite_with_pyargs(tmp_path):
    """`pytest --pyargs edgeplug.testing.conformance --edgeplug-backend B` in the author's project."""
    env = dict(os.environ, PYTHONPATH=str(FIXTURES / "good"))
    env.pop("EDGEPLUG_PLUGINS", None)
    env.pop("EDGEPLUG_DISABLE_PLUGINS", None)
    proc = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "--pyargs", "edgeplug.testing.conformance", "--edgeplug-backend", "tinycpu",
            "-k", "not llama and not kept_whole and not verification",  # the lowerings run in this session
        ],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    # the exact tally: "16 passed" or "6 passed, 1 failed" must not satisfy it
    summary = proc.stdout.strip().splitlines()[-1]
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?)", summary)}
    selected = len(conformance.__all__) - counts.get("deselected", 0)
    assert counts.get("passed") == selected - counts.get("skipped", 0), summary
    assert counts.get("passed", 0) >= 6 and "failed" not in counts and "error" not in summary, summary
