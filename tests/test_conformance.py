"""The conformance suite over the fixture backends, and the suite itself.

The suite lives in ``edgeplug.testing.conformance`` so third-party plugins run
the same checks; importing its tests here runs them for the core's fixture
backends (tests/fixtures/backends). Each first-party plugin runs it for its own
backend in its tests (``EDGEPLUG_BACKENDS`` in its test_backend.py), where its
row of DESIGN.md's fusion-policy table is checked too.
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
from edgeplug.testing.conformance import *  # noqa: F401,F403  (the suite, over EDGEPLUG_BACKENDS)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
#: the suite runs for these (tests/fixtures/backends), registered by the autouse fixture below: a backend
#: keeping aten.rms_norm whole and refusing constant-only partitions, and one with its own fused op and
#: host kernel (each first-party backend runs the suite in its own tests, so it runs once per backend)
EDGEPLUG_BACKENDS = ["fixture-keep", "fixture-fused"]


@pytest.fixture(autouse=True)
def _backends(fixture_backends):
    """The fixture backends, registered for every test of this module (the suite's included)."""


def test_suite_selects_every_installed_backend(request):
    """Without EDGEPLUG_BACKENDS or --edgeplug-backend, the suite runs for every backend installed."""
    from edgeplug.testing.plugin import selected_backends

    if request.config.getoption("--edgeplug-backend"):
        pytest.skip("backends selected on the command line")
    selected = selected_backends(request.config)
    assert selected and set(selected) == set(edgeplug.backends())
    assert set(EDGEPLUG_BACKENDS) <= set(selected)  # registered ones too


# -- the suite catches what it promises to catch ------------------------------------


def _spec(**overrides):
    fields = dict(backend="sloppy", description="x", backend_id="BackendWithCompilerDemo", partitioner=list)
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
    from executorch.exir.backend.test.op_partitioner_demo import AddMulPartitionerDemo

    class Mute:
        @edgeplug.hookimpl
        def edgeplug_backends(self):
            yield _spec(partitioner=AddMulPartitionerDemo, availability=lambda: edgeplug.Availability(ok=False, reason="no"))

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
            from executorch.exir.backend.test.op_partitioner_demo import AddMulPartitionerDemo

            yield _spec(partitioner=AddMulPartitionerDemo)

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
            from executorch.exir.backend.test.op_partitioner_demo import AddMulPartitionerDemo

            yield _spec(partitioner=AddMulPartitionerDemo)

        @edgeplug.hookimpl
        def edgeplug_kernels(self):
            # a namespace no library registered at load: accepted then, refused by the suite
            yield edgeplug.Kernel(backend="sloppy", op="my_npu_ops.gelu.default", impl=print, device="cpu")

    edgeplug_register(Ghost(), name="ghost")
    with pytest.raises(AssertionError, match=r"kernel op 'my_npu_ops.gelu.default' of backend 'sloppy' is not a registered operator"):
        conformance.test_kernels_name_registered_ops(edgeplug.get_backend("sloppy"))


@pytest.mark.slow
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
