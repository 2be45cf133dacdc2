"""Lowering at model scale (issue 27), the core's part on the fixture backends: the weights are shared,
never copied; the per-stage memory profile (``profile_memory``) only when asked; a backend without
external weights refuses them before any work, in the API and the CLI. The ``.ptd`` written and run in
executorch's runtime is tested with a backend that has external weights (its plugin's tests)."""

from __future__ import annotations

import pytest
import torch

import edgeplug
from edgeplug.examples.llama import tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
BACKEND = "fixture-table"  # no external weights


@pytest.fixture(scope="module", autouse=True)
def fb():
    import edgeplug_fixture_backends

    with edgeplug_fixture_backends.registered() as module:
        yield module


@pytest.fixture(scope="module")
def decoder():
    return tiny_llama()


def test_profile_memory_puts_each_stages_peak_in_the_report(decoder):
    model, args = decoder
    result = edgeplug.lower(model, args, BACKEND, dry_run=True, profile_memory=True)
    stages = {s.stage: s.peak_rss_mib for s in result.report.stages}
    assert {"export", "to_edge", "partition + delegate"} <= set(stages), stages
    assert all(isinstance(v, float) and v > 0 for v in stages.values()), stages
    assert "MiB peak" in result.report.to_table()


def test_without_profile_memory_no_peaks(decoder):
    model, args = decoder
    result = edgeplug.lower(model, args, BACKEND, dry_run=True)
    assert result.report.stages and all(s.peak_rss_mib is None for s in result.report.stages)
    assert "MiB peak" not in result.report.to_table()


def test_the_callers_model_is_unchanged_and_its_weights_shared(decoder):
    model, args = decoder
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = edgeplug.lower(model, args, BACKEND, dry_run=True)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.requires_grad for p in model.parameters())  # the caller's flags stay as they were
    mine = {p.untyped_storage().data_ptr() for p in model.parameters()}
    ep = result.exported_program
    lowered = {ep.state_dict[n].untyped_storage().data_ptr() for n in ep.graph_signature.parameters}
    assert lowered
    assert lowered <= mine, "the exported program holds copies of the caller's weights"


def test_a_backend_without_external_weights_refuses_before_any_work(decoder):
    model, args = decoder
    with pytest.raises(edgeplug.EdgeplugError, match=rf"backend '{BACKEND}' cannot put its weights into a \.ptd.*nothing was done"):
        edgeplug.lower(model, args, BACKEND, external_weights=True, dry_run=True)


def test_an_exported_programs_weights_are_shared_and_its_flags_left_alone(decoder):
    model, args = decoder
    ep = torch.export.export(model, args)
    flags = {n: t.requires_grad for n, t in ep.state_dict.items()}
    result = edgeplug.lower(ep, args, BACKEND, dry_run=True)
    mine = {ep.state_dict[n].untyped_storage().data_ptr() for n in ep.graph_signature.parameters}
    lowered = result.exported_program
    theirs = {lowered.state_dict[n].untyped_storage().data_ptr() for n in lowered.graph_signature.parameters}
    assert theirs and theirs <= mine, "the lowering copied the program's weights"
    assert {n: t.requires_grad for n, t in ep.state_dict.items()} == flags


def test_cli_refuses_external_weights_for_a_backend_without_them(cli, tmp_path):
    code, _, stderr = cli("lower", "mlp", "-b", BACKEND, "--external-weights", "-o", tmp_path / "m.pte")
    assert code != 0
    assert "cannot put its weights into a .ptd" in stderr
    assert not list(tmp_path.iterdir())


def test_a_lowerings_delegates_go_with_its_result(decoder):
    """torch's fake-tensor dispatch cache and executorch's node-comparison cache held every delegate a
    lowering made (its blob and named data: the weights) until the process ended."""
    import gc
    import weakref

    from executorch.exir.lowered_backend_module import get_lowered_submodules

    model, args = decoder
    result = edgeplug.lower(model, args, BACKEND)
    lowered = get_lowered_submodules(result.edge.exported_program().graph_module)
    delegates = [weakref.ref(module) for _, module, _ in lowered]
    del lowered
    assert delegates
    del result
    gc.collect()
    assert [d for d in delegates if d() is not None] == []
