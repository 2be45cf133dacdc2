"""Plugin discovery, validation, conflicts, blocking: through real installed distributions.

Each case is a folder in tests/fixtures holding a distribution the way pip
installs one (``NAME-VERSION.dist-info`` with METADATA and entry_points.txt,
next to its modules); ``fixture_site`` puts it on ``sys.path`` so discovery
finds it through ``importlib.metadata`` like any installed plugin.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import edgeplug
from edgeplug import plugins
from edgeplug.errors import PluginConflictError, UnknownBackendError
from edgeplug.plugins import PluginWarning

FIRST_PARTY = {"qnn", "samsung", "vulkan", "webgpu", "xnnpack"}


@pytest.fixture(autouse=True)
def _no_env(clean_plugin_env):
    plugins.reset()
    yield
    plugins.reset()


def _problem(plugin_name: str):
    found = [p for p in plugins.problems() if p.plugin.name == plugin_name]
    assert len(found) == 1, [p.message for p in plugins.problems()]
    return found[0].message


# -- import edgeplug stays cheap -------------------------------------------------


def _run_python(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_import_edgeplug_loads_no_plugin_and_neither_torch_nor_executorch():
    out = _run_python(
        """
        import sys
        import edgeplug, edgeplug.testing.plugin
        assert edgeplug.hookimpl is not None and edgeplug.BackendSpec is not None
        assert callable(edgeplug.plugins.register)  # reachable after a bare `import edgeplug`
        heavy = sorted(m for m in sys.modules
                       if m.split('.')[0] in {'torch', 'executorch'} or m.startswith('edgeplug_'))
        print('before:', heavy)
        edgeplug.backends()
        print('after:', sorted(m for m in sys.modules if m.startswith('edgeplug_') and m.endswith('.hooks')))
        """
    )
    before, after = out.strip().splitlines()
    assert before == "before: []"
    # the check above can fail: listing backends does load the plugins
    assert "edgeplug_vulkan.hooks" in after and "edgeplug_xnnpack.hooks" in after


def test_plugins_load_once_and_again_after_reset(edgeplug_register):
    class Counting:
        calls = 0

        @edgeplug.hookimpl
        def edgeplug_backends(self):
            Counting.calls += 1
            yield edgeplug.BackendSpec(
                backend="counted", description="counts its calls", backend_id="XnnpackBackend", partitioner=list
            )

    edgeplug_register(Counting(), name="counting")
    assert "counted" in edgeplug.backends()
    assert "counted" in edgeplug.backends()
    edgeplug.get_backend("counted")
    assert Counting.calls == 1
    plugins.reset()
    edgeplug.backends()
    assert Counting.calls == 2


# -- the first-party plugins ------------------------------------------------------


def test_first_party_backends_are_installed_with_their_distributions():
    assert FIRST_PARTY <= set(edgeplug.backends())
    for name in FIRST_PARTY:
        b = edgeplug.get_backend(name)
        assert b.name == name
        assert b.distribution == f"edgeplug-{name}"
        assert b.plugin.entry_point == f"{name} = edgeplug_{name}.hooks"
    assert plugins.problems() == []


def test_backend_names_are_case_insensitive():
    assert edgeplug.get_backend(" XNNPACK ").name == "xnnpack"


# -- a good third-party distribution ------------------------------------------------


def test_third_party_distribution_is_discovered_with_every_hook(fixture_site):
    import torch

    fixture_site("good")
    assert "tinycpu" in edgeplug.backends()
    b = edgeplug.get_backend("tinycpu")
    assert (b.distribution, b.version) == ("edgeplug-fixture-good", "1.2.3")
    assert b.plugin.entry_point == "tinycpu = edgeplug_fixture_good.hooks"
    # edgeplug_backends
    assert b.spec.backend_id == "XnnpackBackend" and b.spec.verify == "pte"
    # edgeplug_skip_decomp
    assert b.skip_ops == (torch.ops.aten.linear.default,)
    # edgeplug_partitioner_filters
    assert [f.name for f in b.filters] == ["linear-verdict"]
    # edgeplug_fusion_policies
    policy = b.fusion_policy("rms_norm")
    assert policy is not None and policy.target == "aten.rms_norm" and policy.fp32_accumulation
    # edgeplug_kernels
    kernel = b.kernel("aten.gelu.default", "cpu")
    assert kernel is not None and b.kernel("aten.gelu.default", "wgpu") is None
    x = torch.linspace(-3, 3, 7)
    assert torch.equal(kernel.impl(x), torch.nn.functional.gelu(x))
    # edgeplug_passes, in ascending order per stage
    assert [p.name for p in b.passes_for("export")] == ["note-export"]
    assert [p.name for p in b.passes_for("edge")] == ["early", "late"]
    # edgeplug_quantizers
    from edgeplug.quantization import schemes

    assert [(s.scheme, s.weight_bits) for s in schemes("tinycpu")] == [("8a8w", 8)]
    assert b.origin(b.passes[0]).distribution == "edgeplug-fixture-good"
    assert plugins.problems() == []


def test_third_party_plugin_adds_to_an_existing_backend(fixture_site):
    import torch

    before = edgeplug.get_backend("xnnpack").skip_ops
    assert torch.ops.aten.pixel_shuffle.default not in before
    fixture_site("good")
    xnnpack = edgeplug.get_backend("xnnpack")
    assert xnnpack.distribution == "edgeplug-xnnpack"  # the backend stays its registrant's
    assert torch.ops.aten.pixel_shuffle.default in xnnpack.skip_ops


@pytest.fixture
def good_hooks(fixture_site):
    fixture_site("good")
    import edgeplug_fixture_good.hooks as hooks

    hooks.calls.clear()
    return hooks


def test_third_party_backend_lowers_and_runs_through_its_hooks(good_hooks):
    from edgeplug.examples import load_model

    model, inputs, _ = load_model("mlp")
    result = edgeplug.lower(model, inputs, "tinycpu", verify=True, model_name="mlp")
    report = result.report
    assert report.distribution == "edgeplug-fixture-good 1.2.3"
    assert report.partitions and report.partitions[0].backend_id == "XnnpackBackend"
    assert report.verification.max_abs_diff < 1e-4

    kinds = [what for what, _ in good_hooks.calls]
    # the export pass ran on aten IR, before the edge passes, which ran in their order
    assert kinds.index("export pass") < kinds.index("edge pass early") < kinds.index("edge pass late")
    export_ops = dict(good_hooks.calls)["export pass"]
    assert "aten.linear.default" in export_ops
    edge_ops = dict(good_hooks.calls)["edge pass early"]
    assert "aten.linear.default" in edge_ops  # kept whole through to_edge
    # the filter was asked about the kept-whole linear nodes before decomposition
    filtered = [d for what, d in good_hooks.calls if what == "filter"]
    assert any(d.startswith("before_decomposition") and "linear" in d for d in filtered)
    assert report.delegated_ops.get("aten.linear.default") == 2


def test_partitioner_filter_decides_what_stays_whole(good_hooks, monkeypatch):
    from edgeplug.examples import load_model

    monkeypatch.setattr(good_hooks, "linear_verdict", False)
    model, inputs, _ = load_model("mlp")
    report = edgeplug.lower(model, inputs, "tinycpu", dry_run=True, model_name="mlp").report
    assert "aten.linear.default" not in report.delegated_ops
    assert {"aten.addmm.default", "aten.mm.default"} & set(report.delegated_ops), report.delegated_ops


# -- broken plugins are reported and dropped; the others keep working ---------------


def test_import_failure_is_reported_with_entry_point_distribution_and_opt_out(fixture_site):
    fixture_site("broken_import")
    with pytest.warns(PluginWarning, match="brokenimport"):
        names = edgeplug.backends()
    assert FIRST_PARTY <= set(names)
    msg = _problem("brokenimport")
    assert "entry point 'brokenimport = edgeplug_fixture_broken.hooks'" in msg
    assert "distribution edgeplug-fixture-broken 0.2.0" in msg
    assert "failed at import: ModuleNotFoundError: No module named 'edgeplug_fixture_vendor_sdk'" in msg
    assert "EDGEPLUG_DISABLE_PLUGINS=brokenimport" in msg
    assert "uninstall edgeplug-fixture-broken" in msg


def test_disabling_a_broken_plugin_silences_it(fixture_site, monkeypatch):
    fixture_site("broken_import")
    monkeypatch.setenv("EDGEPLUG_DISABLE_PLUGINS", "brokenimport")
    assert FIRST_PARTY <= set(edgeplug.backends())
    assert plugins.problems() == []
    assert [(i.name, why) for i, why in plugins.skipped()] == [
        ("brokenimport", "blocked by EDGEPLUG_DISABLE_PLUGINS=brokenimport")
    ]


def test_hook_that_raises_drops_its_plugin_and_says_which_hook(fixture_site):
    fixture_site("hook_raises")
    with pytest.warns(PluginWarning):
        assert "raiser" not in edgeplug.backends()
    msg = _problem("raiser")
    assert "distribution edgeplug-fixture-raises 0.3.0" in msg
    assert "failed at hook edgeplug_skip_decomp: RuntimeError: op table vendor_ops.json is missing" in msg
    with pytest.raises(UnknownBackendError) as err:
        edgeplug.get_backend("raiser")
    # asking for the backend tells the user why it is missing
    assert "no backend named 'raiser'" in str(err.value)
    assert "op table vendor_ops.json is missing" in str(err.value)


@pytest.mark.parametrize(
    "plugin, expected",
    [
        ("badtype", "failed at hook edgeplug_backends: returned str 'badtype', expected edgeplug.records.BackendSpec"),
        ("badfield", "failed at hook edgeplug_backends: invalid BackendSpec record (partitioner: Input should be callable)"),
        (
            "badop",
            "failed at hook edgeplug_skip_decomp: invalid SkipDecomp record (ops: Value error, "
            "<OpOverloadPacket(op='aten.linear')> is not an operator overload "
            "(use e.g. torch.ops.aten.linear.default, not torch.ops.aten.linear))",
        ),
        ("typo", "failed at registration: PluginValidationError: unknown hook 'edgeplug_backend'"),
    ],
)
def test_invalid_record_names_plugin_field_and_cause(fixture_site, plugin, expected):
    fixture_site("invalid")
    with pytest.warns(PluginWarning):
        names = edgeplug.backends()
    assert not {"badtype", "badfield", "badop", "typo"} & set(names)
    msg = _problem(plugin)
    assert f"plugin {plugin!r} (entry point '{plugin} = edgeplug_fixture_invalid." in msg
    assert "distribution edgeplug-fixture-invalid 0.4.0" in msg
    assert expected in msg
    assert f"EDGEPLUG_DISABLE_PLUGINS={plugin}" in msg


def test_misspelt_hook_lists_the_real_ones(fixture_site):
    fixture_site("invalid")
    with pytest.warns(PluginWarning):
        edgeplug.backends()
    assert "(the hooks are: edgeplug_backends, edgeplug_skip_decomp" in _problem("typo")


def test_api_version_refusal_says_which_versions_are_supported(fixture_site):
    fixture_site("future_api")
    with pytest.warns(PluginWarning):
        assert "future" not in edgeplug.backends()
    msg = _problem("future")
    assert "distribution edgeplug-fixture-future 3.0.0" in msg
    assert "plugin API version 2 is not supported by this edgeplug (supported: 1)" in msg
    assert "install a plugin release built for this core, or upgrade edgeplug" in msg


def test_every_other_backend_keeps_working_when_plugins_are_broken(fixture_site):
    from edgeplug.examples import load_model

    fixture_site("broken_import", "hook_raises", "invalid", "future_api")
    with pytest.warns(PluginWarning):
        names = set(edgeplug.backends())
    assert names == FIRST_PARTY
    assert {p.plugin.name for p in plugins.problems()} == {
        "brokenimport", "raiser", "badtype", "badfield", "badop", "typo", "future"
    }
    for name in FIRST_PARTY:
        assert edgeplug.get_backend(name).skip_ops or name == "xnnpack"
    model, inputs, _ = load_model("mlp")
    report = edgeplug.lower(model, inputs, "xnnpack", dry_run=True).report
    assert report.delegated_nodes == 3


# -- conflicts name both distributions -------------------------------------------


def test_two_backends_of_one_name_is_an_error_naming_both_distributions(fixture_site, monkeypatch):
    fixture_site("conflict_backend")
    with pytest.raises(PluginConflictError) as err:
        edgeplug.backends()
    msg = str(err.value)
    assert "backend 'vulkan' is registered twice" in msg
    assert "distribution edgeplug-vulkan (plugin 'vulkan')" in msg
    assert "distribution edgeplug-fixture-vulkan-clone (plugin 'vulkanclone')" in msg
    assert "EDGEPLUG_DISABLE_PLUGINS" in msg
    # following the advice resolves it
    monkeypatch.setenv("EDGEPLUG_DISABLE_PLUGINS", "vulkanclone")
    assert edgeplug.get_backend("vulkan").distribution == "edgeplug-vulkan"


def test_two_kernels_for_one_op_of_one_backend_is_an_error_naming_both(fixture_site, monkeypatch):
    fixture_site("conflict_kernels")
    with pytest.raises(PluginConflictError) as err:
        edgeplug.get_backend("xnnpack")
    msg = str(err.value)
    assert "two kernels for op 'aten.gelu.default' on backend 'xnnpack' (cpu)" in msg
    assert "distribution edgeplug-fixture-kernels-a (plugin 'kernels-a')" in msg
    assert "distribution edgeplug-fixture-kernels-b (plugin 'kernels-b')" in msg
    monkeypatch.setenv("EDGEPLUG_DISABLE_PLUGINS", "edgeplug-fixture-kernels-b")
    kernel = edgeplug.get_backend("xnnpack").kernel("aten.gelu.default")
    assert edgeplug.get_backend("xnnpack").origin(kernel).distribution == "edgeplug-fixture-kernels-a"


# -- blocking and allow-listing ---------------------------------------------------


def test_disable_blocks_by_plugin_or_distribution_name(monkeypatch):
    monkeypatch.setenv("EDGEPLUG_DISABLE_PLUGINS", "vulkan, edgeplug_webgpu")
    assert set(edgeplug.backends()) == FIRST_PARTY - {"vulkan", "webgpu"}
    with pytest.raises(UnknownBackendError) as err:
        edgeplug.get_backend("vulkan")
    msg = str(err.value)
    assert "plugin 'vulkan' (edgeplug-vulkan, blocked by EDGEPLUG_DISABLE_PLUGINS=vulkan, edgeplug_webgpu)" in msg
    assert "pip install" not in msg  # it is installed, only blocked
    monkeypatch.delenv("EDGEPLUG_DISABLE_PLUGINS")
    assert "vulkan" in edgeplug.backends()  # the variable is read again, no reset needed


def test_allow_list_loads_only_the_named_plugins(fixture_site, monkeypatch):
    fixture_site("good")
    monkeypatch.setenv("EDGEPLUG_PLUGINS", "edgeplug-fixture-good,xnnpack")
    assert edgeplug.backends() == ["tinycpu", "xnnpack"]
    with pytest.raises(UnknownBackendError) as err:
        edgeplug.get_backend("qnn")
    assert "plugin 'qnn' (edgeplug-qnn, not in EDGEPLUG_PLUGINS=edgeplug-fixture-good,xnnpack)" in str(err.value)


def test_unknown_backend_lists_installed_ones_and_how_to_install():
    with pytest.raises(UnknownBackendError) as err:
        edgeplug.get_backend("tpu")
    msg = str(err.value)
    assert "no backend named 'tpu'" in msg
    assert "Installed backends: qnn, samsung, vulkan, webgpu, xnnpack" in msg
    assert "pip install edgeplug-tpu" in msg


# -- programmatic registration ------------------------------------------------------


def _embedded_plugin(backend: str = "embedded"):
    class Embedded:
        @edgeplug.hookimpl
        def edgeplug_backends(self):
            # returning one record (not yielding) is accepted too
            return edgeplug.BackendSpec(
                backend=backend, description="registered in code", backend_id="XnnpackBackend", partitioner=list
            )

    return Embedded()


def test_register_and_unregister_a_plugin_in_code(edgeplug_register):
    plugin = _embedded_plugin()
    info = edgeplug_register(plugin, name="embedding-app")
    assert "embedded" in edgeplug.backends()
    b = edgeplug.get_backend("embedded")
    assert b.plugin == info and info.registered
    assert "registered with edgeplug.plugins.register()" in info.describe()
    plugins.unregister(plugin)
    assert "embedded" not in edgeplug.backends()


def test_registered_plugin_can_be_blocked_and_its_failures_say_how_to_remove_it(edgeplug_register, monkeypatch):
    class Failing:
        @edgeplug.hookimpl
        def edgeplug_passes(self):
            raise ValueError("no passes today")

    edgeplug_register(Failing(), name="failing")
    with pytest.warns(PluginWarning):
        edgeplug.backends()
    msg = _problem("failing")
    assert "failed at hook edgeplug_passes: ValueError: no passes today" in msg
    assert "edgeplug.plugins.unregister('failing')" in msg
    monkeypatch.setenv("EDGEPLUG_DISABLE_PLUGINS", "failing")
    assert plugins.problems() == []


def test_registered_backend_conflicting_with_an_installed_one(edgeplug_register):
    edgeplug_register(_embedded_plugin("xnnpack"), name="my-xnnpack")
    with pytest.raises(PluginConflictError, match=r"distribution edgeplug-xnnpack .*plugin 'my-xnnpack'"):
        edgeplug.backends()


# -- records on their own ----------------------------------------------------------


def test_records_reject_bad_names_and_normalise_good_ones():
    from pydantic import ValidationError

    spec = edgeplug.BackendSpec(backend=" MyNPU ", description="d", backend_id="X", partitioner=list)
    assert spec.backend == "mynpu"
    with pytest.raises(ValidationError, match="backend name 'my npu' must be lower-case letters"):
        edgeplug.BackendSpec(backend="my npu", description="d", backend_id="X", partitioner=list)
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        edgeplug.FusionPolicy(backend="x", target="aten.rms_norm", weigth_sources={"leaf"})
    with pytest.raises(ValidationError, match="stage"):
        edgeplug.PassSpec(backend="x", stage="late", name="p", fn=print)


# -- every hook is exercised -------------------------------------------------------


def _hook_names() -> list[str]:
    from edgeplug import hookspecs

    return sorted(n for n, f in vars(hookspecs).items() if n.startswith("edgeplug_") and callable(f))


@pytest.mark.parametrize("hook", _hook_names())
def test_every_hook_is_exercised(hook):
    """datasette-style: the fixture backend implements each hook and a test here checks its effect."""
    from edgeplug.records import HOOK_RECORDS

    assert hook in HOOK_RECORDS, f"{hook} yields no record type the manager validates"
    good = Path(__file__).parent / "fixtures" / "good" / "edgeplug_fixture_good" / "hooks.py"
    assert f"def {hook}(" in good.read_text(), f"the good fixture distribution does not implement {hook}"
    source = inspect.getsource(test_third_party_distribution_is_discovered_with_every_hook)
    assert re.search(rf"# {hook}\b", source), f"no assertion on {hook} in the discovery test"
