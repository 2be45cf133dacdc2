"""The adversarial plugin battery (issue 24): plugins written with the mistakes a new author makes.

tests/fixtures/battery is one installed distribution, edgeplug-fixture-battery,
with one plugin (entry point) per mistake. Each case ends in one error naming
the plugin and its own file and line, or in a documented refusal; no partial
file is written; every other backend keeps working. With all of them
installed at once, llama still lowers and verifies on a fixture backend
(tests/fixtures/backends, registered beside the battery).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import edgeplug
from edgeplug._registry import lookup as plugins
from edgeplug._registry import PluginWarning
from edgeplug.testing import assert_no_traceback, error_line, files_under

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "battery" / "edgeplug_fixture_battery"


@pytest.fixture(autouse=True)
def _env(clean_plugin_env, monkeypatch, tmp_path):
    # the slow plugin sleeps a minute; the limit stops it after one second
    monkeypatch.setenv("EDGEPLUG_HOOK_TIMEOUT", "1")
    monkeypatch.delenv("EDGEPLUG_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def battery(fixture_site, fixture_backends):
    """The battery installed beside the fixture backends (its kernel-raises plugin adds to fixture-fused)."""
    fixture_site("battery")
    with pytest.warns(PluginWarning):
        names = set(edgeplug.backends())
    return names


def _line(module: str, text: str) -> int:
    """The line of ``text`` in a battery module (so the tests follow the fixture when it is edited)."""
    for number, line in enumerate((FIXTURE / f"{module}.py").read_text().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} is not in {module}.py")


def _at(module: str, text: str) -> str:
    return f"{FIXTURE / module}.py:{_line(module, text)}"


# -- mistakes found while plugins load: the plugin is dropped, named with its own line -------------

LOAD_TIME = [
    ("import-raises", "import", "RuntimeError: vendor op table ops.json is missing", ("import_raises", "raise RuntimeError")),
    ("import-missing", "import", "No module named 'edgeplug_fixture_battery_vendor_sdk'", ("import_missing", "vendor_sdk import")),
    (
        "bad-record", "hook edgeplug_backends",
        "invalid BackendSpec record from hook edgeplug_backends: field 'verify_method' = 'maybe': Input should be",
        ("bad_record", "yield BackendSpec("),
    ),
    ("recursion", "hook edgeplug_backends", "RecursionError: maximum recursion depth exceeded", ("recursion", "return _records(depth + 1)")),
    ("slow", "hook edgeplug_backends", "took longer than 1 s and was stopped", ("slow", "time.sleep(60)")),
    # wrong types from every hook: named by type and value; a str is not iterated, a dict not coerced
    ("wrong-backends", "hook edgeplug_backends", "returned str 'bat_wrong_backends'; edgeplug_backends must yield records", ("wrong_types", 'return "bat_wrong_backends"')),
    ("wrong-keep-whole", "hook edgeplug_keep_whole", "returned dict {'backend': 'bat_wrong_keep_whole'", ("wrong_types", 'return {"backend": "bat_wrong_keep_whole"')),
    ("wrong-filters", "hook edgeplug_partitioner_filters", "returned int 3;", ("wrong_types", "return 3")),
    ("wrong-fusion", "hook edgeplug_fusion_policies", "yielded a KeepWhole, the record of another hook; edgeplug_fusion_policies yields", ("wrong_types", "yield KeepWhole(")),
    ("wrong-kernels", "hook edgeplug_kernels", "yielded str 'aten.linear.default'; edgeplug_kernels yields edgeplug.plugin.Kernel records only", ("wrong_types", 'yield "aten.linear.default"')),
    ("wrong-passes", "hook edgeplug_passes", "yielded dict {'backend': 'bat_wrong_passes'", ("wrong_types", 'yield {"backend": "bat_wrong_passes"')),
    ("wrong-quantizers", "hook edgeplug_quantizers", "yielded NoneType None;", ("wrong_types", "yield None")),
]


def test_every_load_time_mistake_is_one_problem_naming_the_plugin_and_its_line(battery):
    problems = {p.plugin.name: p for p in plugins.problems()}
    for plugin, stage, cause, (module, text) in LOAD_TIME:
        problem = problems.pop(plugin, None)
        assert problem is not None, f"{plugin} was not reported"
        message = problem.message
        assert f"plugin {plugin!r} (entry point '{plugin} = edgeplug_fixture_battery." in message
        assert "distribution edgeplug-fixture-battery 0.9.0" in message
        assert f"failed at {stage}: " in message and cause in message, message
        # the plugin's own file and line, never importlib's, pluggy's or pydantic's
        assert _at(module, text) in message, message
        assert f"EDGEPLUG_DISABLE_PLUGINS={plugin}" in message
        assert not re.search(r"(importlib|pydantic|pluggy)[/\\][^ ]*\.py:\d+", message), message
    assert not problems, f"unexpected problems: {[p.message for p in problems.values()]}"
    # the dropped plugins' backends are absent; everything else is there
    assert not {n for n in battery if n.startswith("bat_wrong") or n in ("bat_slow", "bat_bad_record")}
    import edgeplug_fixture_backends

    assert set(edgeplug_fixture_backends.ALL) <= battery  # every other backend is still there
    assert {"bat_filter_str", "bat_factory_raises", "bat_pass_raises"} <= battery


# -- mistakes found while lowering: one error line naming the plugin and its line, nothing written --


FILTER_ANSWERS = [
    ("bat_filter_str", "filter-str", "returned str 'no linear on this NPU'", "return refuse('no linear on this NPU')"),
    ("bat_filter_refuse", "filter-refuse", "returned function <function refuse", "call it with the reason"),
    ("bat_filter_zero", "filter-zero", "returned int 0", "bool(...)"),
    ("bat_filter_yes", "filter-yes", "returned str 'yes'", "return refuse('yes')"),
    ("bat_filter_raises", "filter-raises", "raised KeyError: 'npu_tile' at " + _at("lowering", 'raise KeyError(node.meta["npu_tile"])'), ""),
    ("bat_filter_mutates", "filter-mutates", "changed the program while answering", "in a pass (edgeplug_passes)"),
]


@pytest.mark.parametrize("backend, plugin, what, fix", FILTER_ANSWERS, ids=[c[1] for c in FILTER_ANSWERS])
def test_a_filter_answer_outside_the_contract_stops_the_lowering(battery, cli, tmp_path, backend, plugin, what, fix):
    code, stdout, stderr = cli("lower", "mlp", "-b", backend, "-q", "-o", tmp_path / "m.pte", "--report", tmp_path / "r.json")
    assert code == 2 and stdout == ""
    first = error_line(stderr)
    assert_no_traceback(stderr)
    assert f"partitioner filter 'no_linear' ({_at('lowering', 'def on_linear(node, ctx):')})" in first, first
    assert f"of backend {backend!r} from plugin {plugin!r} (edgeplug-fixture-battery)" in first
    assert re.search(r"on node '\w+' \(aten\.\w+\.\w+\) at stage '\w+'", first), first
    assert what in first and fix in first, first
    assert files_under(tmp_path) == []


def test_a_filter_answer_is_checked_through_the_python_api_too(battery, tmp_path):
    from edgeplug._errors import EdgeplugError
    from edgeplug.examples import load_model

    model, args = load_model("mlp")[:2]
    with pytest.raises(EdgeplugError, match=r"partitioner filter 'no_linear'.*returned str 'no linear on this NPU'"):
        edgeplug.lower(model, args, "bat_filter_str")
    # a valid answer on the same model: the refusal is reported, not an error
    result = edgeplug.lower(model, args, "fixture-table", dry_run=True)
    assert result.report.delegated_nodes > 0


def test_a_partitioner_factory_that_raises_is_unavailable_in_backends_and_named_when_lowering(battery, cli, tmp_path):
    code, stdout, _ = cli("backends", "--probe")  # the listing alone builds no partitioner
    assert code == 0
    row = next(l for l in stdout.splitlines() if l.startswith("bat_factory_raises "))
    assert "no: its partitioner factory (BackendSpec.partitioner) raised AttributeError: SM9999 is not a known SoC" in row
    assert _at("lowering", 'raise AttributeError("SM9999') in row
    assert re.search(r"^fixture-table .* yes$", stdout, re.M), stdout  # the others are still available
    code, stdout, stderr = cli("lower", "mlp", "-b", "bat_factory_raises", "-q", "-o", tmp_path / "m.pte")
    assert code == 2
    first = error_line(stderr)
    assert_no_traceback(stderr)
    assert "plugin 'factory-raises'" in first and "SM9999" in first
    assert _at("lowering", 'raise AttributeError("SM9999') in first, first
    assert files_under(tmp_path) == []


def test_a_pass_that_raises_names_its_plugin(battery, cli, tmp_path):
    code, stdout, stderr = cli("lower", "mlp", "-b", "bat_pass_raises", "-q", "-o", tmp_path / "m.pte")
    assert code == 2 and stdout == ""
    first = error_line(stderr)
    assert_no_traceback(stderr)
    assert "edge-stage pass 'split_heads' of backend 'bat_pass_raises'" in first, first
    assert "plugin 'pass-raises'" in first and "KeyError" in first
    raised_at = _at("lowering", 'raise KeyError("attention.wq")')
    assert f"KeyError: 'attention.wq' (raised at {raised_at} in split_heads)" in first, first
    assert files_under(tmp_path) == []


def test_a_kernel_that_raises_names_its_plugin(battery, cli, tmp_path):
    code, stdout, stderr = cli("lower", "mlp", "-b", "fixture-fused", "--verify", "-q", "-o", tmp_path / "m.pte")
    assert code == 2 and stdout == ""
    first = error_line(stderr)
    assert_no_traceback(stderr)
    assert first.startswith("edgeplug: error: stage 'verify': plugin 'kernel-raises'"), first
    assert "RuntimeError: dispatch table overflow" in first
    assert _at("lowering", 'raise RuntimeError("dispatch table overflow")') in first, first
    assert files_under(tmp_path) == []


@pytest.mark.slow
def test_with_every_broken_plugin_installed_llama_lowers_and_verifies(battery, cli, tmp_path):
    out = tmp_path / "llama.pte"
    code, stdout, stderr = cli("lower", "handwritten-llama-decoder", "--backend", "fixture-fused", "--verify", "-q", "-o", out)
    assert code == 0, stderr
    assert out.stat().st_size > 0 and files_under(tmp_path) == ["llama.pte"]
    assert "verified" in stdout.lower() or "max |diff|" in stdout.lower() or "verification" in stdout.lower(), stdout


# -- refusals the contract documents ----------------------------------------------------------------


class _NoRuntime:
    @edgeplug.hookimpl
    def edgeplug_backends(self):
        from edgeplug.plugin import BackendSpec

        def partitioner():
            raise AssertionError("a refused --verify must not build the partitioner")

        yield BackendSpec(
            backend="npu_no_runtime", description="an NPU whose programs cannot run on the host",
            backend_id="NpuNoRuntimeBackend", partitioner=partitioner, verify_method="none",
        )


def test_verify_on_a_backend_that_cannot_run_here_is_refused_before_any_work(cli, edgeplug_register, tmp_path):
    from edgeplug._errors import VerificationError

    edgeplug_register(_NoRuntime(), name="npu-plugin")
    code, stdout, stderr = cli("lower", "/no/such/model.py:make", "-b", "npu_no_runtime", "--verify", "-o", tmp_path / "m.pte")
    assert code == 2 and stdout == ""
    first = error_line(stderr)  # refused before the (missing) model file is even read
    assert_no_traceback(stderr)
    assert "backend 'npu_no_runtime' cannot verify here: its BackendSpec.verify_method is 'none'" in first
    assert "Lower without --verify" in first and "--dry-run" in first
    assert files_under(tmp_path) == []
    with pytest.raises(VerificationError, match="cannot verify here"):
        edgeplug.lower(torch.nn.Linear(2, 2), (torch.randn(1, 2),), "npu_no_runtime", verify=True)


def test_the_conflict_hint_offers_to_disable_the_newcomer_not_the_owner(fixture_site):
    fixture_site("good", "battery_conflict")
    with pytest.warns(PluginWarning):
        assert "tinycpu" not in edgeplug.backends()
    (conflict,) = [c for c in plugins.conflicts() if c.backend == "tinycpu"]
    assert "disable the newcomer with EDGEPLUG_DISABLE_PLUGINS=aaa-addon" in conflict.message
    assert "EDGEPLUG_DISABLE_PLUGINS=tinycpu" not in conflict.message


def test_lower_help_lists_the_schemes_of_installed_backends_only(cli, fixture_site, monkeypatch):
    fixture_site("good")
    code, stdout, _ = cli("lower", "--help")
    assert code == 0
    text = " ".join(stdout.split())
    assert "tinycpu: 8a8w" in text
    monkeypatch.setenv("EDGEPLUG_DISABLE_PLUGINS", "tinycpu")
    plugins.reset()
    code, stdout, _ = cli("lower", "--help")
    text = " ".join(stdout.split())
    assert "tinycpu: " not in text and "(installed: " in text
    plugins.reset()


def test_the_scaffold_readme_suggests_only_commands_the_backend_can_run():
    from edgeplug._scaffold import render

    own = render("npu", "executorch.exir.backend.test.op_partitioner_demo:AddMulPartitionerDemo", "BackendWithCompilerDemo")
    assert 'verify_method="none"' in own["edgeplug_npu/hooks.py"]
    assert "--verify\n" not in own["README.md"] and "--backend npu --verify" not in own["README.md"]
    assert "edgeplug lower handwritten-llama-decoder --backend npu -o llama.pte" in own["README.md"]
    xnn = render("cpu2")
    assert 'verify_method="pte"' in xnn["edgeplug_cpu2/hooks.py"]
    assert "edgeplug lower handwritten-llama-decoder --backend cpu2 --verify" in xnn["README.md"]
