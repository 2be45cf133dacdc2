"""Plugin discovery, validation, conflicts, blocking: through real installed distributions.

Each case is a folder in tests/fixtures holding a distribution the way pip
installs one (``NAME-VERSION.dist-info`` with METADATA and entry_points.txt,
next to its modules); ``fixture_site`` puts it on ``sys.path`` so discovery
finds it through ``importlib.metadata`` like any installed plugin.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import warnings
import pytest

import edgeplug
from edgeplug._registry import lookup as plugins
from edgeplug._errors import PluginConflictError, UnknownBackendError
from edgeplug._registry import PluginWarning


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
        assert callable(edgeplug.register_plugin)  # reachable after a bare `import edgeplug`
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
    assert after.startswith("after: ['edgeplug_"), after


def test_plugins_load_once_and_again_after_reset(edgeplug_register):
    class Counting:
        calls = 0

        @edgeplug.hookimpl
        def edgeplug_backends(self):
            Counting.calls += 1
            yield edgeplug.BackendSpec(
                backend="counted", description="counts its calls", backend_id="CountedBackend", partitioner=list
            )

    edgeplug_register(Counting(), name="counting")
    assert "counted" in edgeplug.backends()
    assert "counted" in edgeplug.backends()
    edgeplug.get_backend("counted")
    assert Counting.calls == 1
    plugins.reset()
    edgeplug.backends()
    assert Counting.calls == 2



def test_backend_names_are_case_insensitive(fixture_site):
    fixture_site("good")
    assert edgeplug.get_backend(" TinyCPU ").name == "tinycpu"


# -- a good third-party distribution ------------------------------------------------


def test_third_party_distribution_is_discovered_with_every_hook(fixture_site, fixture_backends):
    import torch

    fixture_site("good")
    assert "tinycpu" in edgeplug.backends()
    b = edgeplug.get_backend("tinycpu")
    assert (b.distribution, b.version) == ("edgeplug-fixture-good", "1.2.3")
    assert b.plugin.entry_point == "tinycpu = edgeplug_fixture_good.hooks"
    assert b.spec.backend_id == "TinyCpuBackend" and b.spec.verify_method == "kernels"
    assert b.keep_whole == (torch.ops.aten.linear.default,)
    assert [f.name for f in b.filters] == ["linear-verdict"]
    policy = b.fusion_policy("rms_norm")
    assert policy is not None and policy.target == "aten.rms_norm" and policy.fp32_accumulation
    kernel = b.kernel("aten.gelu.default", "cpu")
    assert kernel is not None and b.kernel("aten.gelu.default", "wgpu") is None
    x = torch.linspace(-3, 3, 7)
    assert torch.equal(kernel.impl(x), torch.nn.functional.gelu(x))
    # passes: "late" is constrained after "early" although its order is lower
    assert [p.name for p in b.passes_for("export")] == ["note-export"]
    assert [p.name for p in b.passes_for("edge")] == ["early", "late"]
    # edgeplug_quantizers
    from edgeplug._quantize.quantize import schemes

    assert [(s.scheme, s.weight_bits) for s in schemes(edgeplug.get_backend("tinycpu"))] == [("8a8w", 8)]
    assert {b.origin(r).distribution for r in (*b.passes, *b.filters, *b.kernels)} == {"edgeplug-fixture-good"}
    assert plugins.problems() == [] and plugins.conflicts() == [] and plugins.unclaimed() == []


def test_third_party_plugin_adds_to_an_existing_backend(fixture_site, fixture_backends):
    import torch

    before = edgeplug.get_backend(fixture_backends.TABLE)
    assert torch.ops.aten.pixel_shuffle.default not in before.keep_whole
    fixture_site("adds_to_table")
    table = edgeplug.get_backend(fixture_backends.TABLE)
    assert table.distribution == before.distribution != "edgeplug-fixture-table-addon"  # stays its registrant's
    assert torch.ops.aten.pixel_shuffle.default in table.keep_whole
    # each record is kept with the plugin it came from
    added = [c for c in table.contributions if c.plugin.distribution == "edgeplug-fixture-table-addon"]
    assert [type(c.record).__name__ for c in added] == ["KeepWhole"]


def test_a_record_for_a_backend_nobody_registers_is_unclaimed(fixture_site):
    fixture_site("adds_to_table")  # adds to fixture-table, which is not registered here
    assert "fixture-table" not in edgeplug.backends()
    assert [u.contribution.record.backend for u in plugins.unclaimed()] == ["fixture-table"]


@pytest.fixture
def good_hooks(fixture_site):
    fixture_site("good")
    import edgeplug_fixture_good.hooks as hooks

    hooks.calls.clear()
    return hooks


def test_third_party_backend_lowers_and_runs_through_its_hooks(good_hooks):
    from edgeplug.examples import load_model

    model, inputs, _, _ = load_model("mlp")
    result = edgeplug.lower(model, inputs, "tinycpu", verify=True, model_name="mlp")
    report = result.report
    assert report.distribution == "edgeplug-fixture-good 1.2.3"
    assert report.partitions and report.partitions[0].backend_id == "TinyCpuBackend"
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
    model, inputs, _, _ = load_model("mlp")
    report = edgeplug.lower(model, inputs, "tinycpu", dry_run=True, model_name="mlp").report
    assert "aten.linear.default" not in report.delegated_ops
    assert {"aten.addmm.default", "aten.mm.default"} & set(report.delegated_ops), report.delegated_ops


# -- broken plugins are reported and dropped; the others keep working ---------------


def test_import_failure_is_reported_with_entry_point_distribution_and_opt_out(fixture_site):
    fixture_site("good", "broken_import")
    with pytest.warns(PluginWarning, match="brokenimport"):
        names = edgeplug.backends()
    assert "tinycpu" in names
    msg = _problem("brokenimport")
    assert "entry point 'brokenimport = edgeplug_fixture_broken.hooks'" in msg
    assert "distribution edgeplug-fixture-broken 0.2.0" in msg
    assert "failed at import: ModuleNotFoundError: No module named 'edgeplug_fixture_vendor_sdk'" in msg
    assert "EDGEPLUG_DISABLE_PLUGINS=brokenimport" in msg
    assert "uninstall edgeplug-fixture-broken" in msg


def test_an_entry_point_naming_a_module_that_is_not_there_says_where_to_look(fixture_site):
    fixture_site("good", "missing_module")
    with pytest.warns(PluginWarning, match="missingmod"):
        assert "tinycpu" in edgeplug.backends()
    msg = _problem("missingmod")
    assert "No module named 'edgeplug_fixture_missing_hooks'" in msg
    assert "names a module that cannot be imported: check [project.entry-points.edgeplug]" in msg
    assert "no frame of the plugin's code" not in msg
    # a dependency the plugin's own module imports is not the entry point's fault: the frame is named instead
    fixture_site("broken_import")
    with pytest.warns(PluginWarning):
        edgeplug.backends()
    assert "check [project.entry-points.edgeplug]" not in _problem("brokenimport")


def test_disabling_a_broken_plugin_silences_it(fixture_site, monkeypatch):
    fixture_site("good", "broken_import")
    monkeypatch.setenv("EDGEPLUG_DISABLE_PLUGINS", "brokenimport")
    assert "tinycpu" in edgeplug.backends()
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
    # the message keeps the file and line that raised
    assert "failed at hook edgeplug_keep_whole: RuntimeError: op table vendor_ops.json is missing" in msg
    assert re.search(r"\(raised at \S*edgeplug_fixture_raises\.py:19 in edgeplug_keep_whole\)", msg), msg
    with pytest.raises(UnknownBackendError) as err:
        edgeplug.get_backend("raiser")
    # asking for the backend tells the user why it is missing
    assert "no backend named 'raiser'" in str(err.value)
    assert "op table vendor_ops.json is missing" in str(err.value)


@pytest.mark.parametrize(
    "plugin, expected",
    [
        ("badtype", "failed at hook edgeplug_backends: yielded str 'badtype'; edgeplug_backends yields "
         "edgeplug.plugin.BackendSpec records only"),
        # a dict is not converted into a record: it is named, with the line that yielded it
        ("badfield", "failed at hook edgeplug_backends: yielded dict {'backend': 'badfield'"),
        (
            "badop",
            "failed at hook edgeplug_keep_whole: invalid KeepWhole record from hook edgeplug_keep_whole: "
            "field 'ops' = (<OpOverloadPacket(op='aten.linear')>,): Value error, "
            "<OpOverloadPacket(op='aten.linear')> is not an operator overload "
            "(use e.g. torch.ops.aten.linear.default, not torch.ops.aten.linear) (raised at ",
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
    assert "(the hooks are: edgeplug_backends, edgeplug_keep_whole" in _problem("typo")


def test_api_version_refusal_says_which_versions_are_supported(fixture_site):
    fixture_site("future_api")
    with pytest.warns(PluginWarning):
        assert "future" not in edgeplug.backends()
    msg = _problem("future")
    assert "distribution edgeplug-fixture-future 3.0.0" in msg
    assert msg.count("\n") == 0  # one line
    assert "it wants plugin API 2 (BackendSpec.api_version), this edgeplug speaks plugin API 1 (edgeplug 0.1)" in msg
    assert "upgrade edgeplug to 0.2 or later, or install a release of the plugin built for API 1" in msg


def test_every_other_backend_keeps_working_when_plugins_are_broken(fixture_site):
    from edgeplug.examples import load_model

    fixture_site("good", "broken_import", "hook_raises", "invalid", "future_api")
    with pytest.warns(PluginWarning):
        names = set(edgeplug.backends())
    assert "tinycpu" in names
    assert {p.plugin.name for p in plugins.problems()} == {
        "brokenimport", "raiser", "badtype", "badfield", "badop", "typo", "future"
    }
    for name in names:
        assert edgeplug.get_backend(name).name == name
    model, inputs, _, _ = load_model("mlp")
    report = edgeplug.lower(model, inputs, "tinycpu", dry_run=True).report
    assert report.delegated_nodes == 3


# -- conflicts name both distributions -------------------------------------------


def test_two_backends_of_one_name_make_only_that_backend_unavailable(fixture_site, monkeypatch, fixture_backends):
    from edgeplug.examples import load_model

    fixture_site("good")
    others = set(edgeplug.backends()) - {"tinycpu"}
    plugins.reset()
    fixture_site("conflict_backend")
    with pytest.warns(PluginWarning, match="backend 'tinycpu' is unavailable"):
        names = set(edgeplug.backends())
    assert names == others
    with pytest.raises(PluginConflictError) as err:
        edgeplug.get_backend("tinycpu")
    msg = str(err.value)
    assert "backend 'tinycpu' is registered twice" in msg
    assert "distribution edgeplug-fixture-good (plugin 'tinycpu')" in msg
    assert "distribution edgeplug-fixture-tinycpu-clone (plugin 'tinycpuclone')" in msg
    assert "EDGEPLUG_DISABLE_PLUGINS=tinycpuclone" in msg
    assert [c.backend for c in plugins.conflicts()] == ["tinycpu"]
    # every other backend keeps working
    model, inputs, _, _ = load_model("mlp")
    assert edgeplug.lower(model, inputs, fixture_backends.TABLE, dry_run=True).report.delegated_nodes == 5
    # following the advice resolves it
    monkeypatch.setenv("EDGEPLUG_DISABLE_PLUGINS", "tinycpuclone")
    assert edgeplug.get_backend("tinycpu").distribution == "edgeplug-fixture-good"


def test_two_kernels_for_one_op_of_one_backend_is_an_error_naming_both(fixture_site, monkeypatch, fixture_backends):
    fixture_site("conflict_kernels")
    fused = fixture_backends.FUSED
    with pytest.raises(PluginConflictError) as err:
        edgeplug.get_backend(fused)
    assert fused not in edgeplug.backends() and fixture_backends.TABLE in edgeplug.backends()
    msg = str(err.value)
    assert f"two kernels for op 'aten.gelu.default' on backend '{fused}' (cpu)" in msg
    assert "distribution edgeplug-fixture-kernels-a (plugin 'kernels-a')" in msg
    assert "distribution edgeplug-fixture-kernels-b (plugin 'kernels-b')" in msg
    monkeypatch.setenv("EDGEPLUG_DISABLE_PLUGINS", "edgeplug-fixture-kernels-b")
    kernel = edgeplug.get_backend(fused).kernel("aten.gelu.default")
    assert edgeplug.get_backend(fused).origin(kernel).distribution == "edgeplug-fixture-kernels-a"


# -- blocking and allow-listing ---------------------------------------------------


def test_disable_blocks_by_plugin_or_distribution_name(fixture_site, monkeypatch):
    fixture_site("good", "misuse")
    monkeypatch.setenv("EDGEPLUG_DISABLE_PLUGINS", "tinycpu, edgeplug_fixture_misuse")
    names = set(edgeplug.backends())
    assert "tinycpu" not in names and "toyaccel" not in names
    assert {i.name for i, _ in plugins.skipped()} == {"tinycpu", "unmarked", "badkernel", "toyaccel"}
    with pytest.raises(UnknownBackendError) as err:
        edgeplug.get_backend("tinycpu")
    msg = str(err.value)
    assert "plugin 'tinycpu' (edgeplug-fixture-good, blocked by EDGEPLUG_DISABLE_PLUGINS=tinycpu, edgeplug_fixture_misuse)" in msg
    assert "pip install" not in msg  # it is installed, only blocked
    monkeypatch.delenv("EDGEPLUG_DISABLE_PLUGINS")
    assert "tinycpu" in edgeplug.backends()  # the variable is read again, no reset needed


def test_allow_list_loads_only_the_named_plugins(fixture_site, monkeypatch):
    fixture_site("good", "adds_to_table", "misuse")
    monkeypatch.setenv("EDGEPLUG_PLUGINS", "edgeplug-fixture-good,tableaddon")
    assert edgeplug.backends() == ["tinycpu"]
    assert {i.name for i in plugins.manager().plugins()} == {"tinycpu", "tableaddon"}
    with pytest.raises(UnknownBackendError) as err:
        edgeplug.get_backend("toyaccel")
    assert "plugin 'toyaccel' (edgeplug-fixture-misuse, not in EDGEPLUG_PLUGINS=edgeplug-fixture-good,tableaddon)" in str(err.value)


def test_unknown_backend_lists_installed_ones_and_suggests_the_nearest(fixture_site):
    fixture_site("good")
    with pytest.raises(UnknownBackendError) as err:
        edgeplug.get_backend("tinycpi")
    msg = str(err.value)
    assert "no backend named 'tinycpi'; did you mean 'tinycpu'?" in msg
    assert re.search(r"Installed backends: (\w+, )*tinycpu\b", msg), msg
    # a name anyone could register on PyPI is never suggested
    assert "pip install" not in msg
    with pytest.raises(UnknownBackendError) as err:
        edgeplug.get_backend("quux")
    assert "pip install" not in str(err.value) and "did you mean" not in str(err.value)


def test_an_installed_backend_left_out_of_the_allow_list_says_so(fixture_site, monkeypatch):
    fixture_site("good", "misuse")
    monkeypatch.setenv("EDGEPLUG_PLUGINS", "tinycpu")
    with pytest.raises(UnknownBackendError) as err:
        edgeplug.get_backend("toyaccel")
    assert "not in EDGEPLUG_PLUGINS=tinycpu" in str(err.value)  # installed, only not allowed


# -- programmatic registration ------------------------------------------------------


def _embedded_plugin(backend: str = "embedded"):
    class Embedded:
        @edgeplug.hookimpl
        def edgeplug_backends(self):
            # returning one record (not yielding) is accepted too
            return edgeplug.BackendSpec(
                backend=backend, description="registered in code", backend_id="EmbeddedBackend", partitioner=list
            )

    return Embedded()


def test_register_and_unregister_a_plugin_in_code(edgeplug_register):
    plugin = _embedded_plugin()
    info = edgeplug_register(plugin, name="embedding-app")
    assert "embedded" in edgeplug.backends()
    b = edgeplug.get_backend("embedded")
    assert b.plugin == info and info.registered
    assert "registered with edgeplug.register_plugin()" in info.describe()
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
    assert "edgeplug.unregister_plugin('failing')" in msg
    monkeypatch.setenv("EDGEPLUG_DISABLE_PLUGINS", "failing")
    assert plugins.problems() == []


def test_registered_backend_conflicting_with_an_installed_one(fixture_site, edgeplug_register):
    fixture_site("good")
    edgeplug_register(_embedded_plugin("tinycpu"), name="my-tinycpu")
    with pytest.warns(PluginWarning):
        assert "tinycpu" not in edgeplug.backends()
    with pytest.raises(PluginConflictError, match=r"distribution edgeplug-fixture-good .*plugin 'my-tinycpu'"):
        edgeplug.get_backend("tinycpu")


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
    from edgeplug import _hookspecs as hookspecs

    return sorted(n for n, f in vars(hookspecs).items() if n.startswith("edgeplug_") and callable(f))


@pytest.mark.parametrize("hook", _hook_names())
def test_every_hook_is_exercised(hook, fixture_site):
    """datasette-style: every hook of the good fixture distribution reaches the resolved Backend."""
    from edgeplug._records import HOOK_RECORDS

    record_type = HOOK_RECORDS.get(hook)
    assert record_type is not None, f"{hook} yields no record type the manager validates"
    fixture_site("good")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginWarning)
        edgeplug.backends()
    dist = "edgeplug-fixture-good"
    b = edgeplug.get_backend("tinycpu")
    ours = [c.record for c in b.contributions if c.plugin.distribution == dist and isinstance(c.record, record_type)]
    assert ours, f"no {record_type.__name__} from {hook} reached the resolved backend"
    assert all(b.origin(r).distribution == dist for r in ours)
    assert set(b.records(record_type)) >= set(ours)


# -- registry: load-time problems ---------------------------------------------------


def _backend_plugin(name: str = "regtest"):
    class Registers:
        @edgeplug.hookimpl
        def edgeplug_backends(self):
            yield edgeplug.BackendSpec(backend=name, description="d", backend_id="RegTestBackend", partitioner=list)

    return Registers()


def _passes(*specs: dict):
    class Passes:
        @edgeplug.hookimpl
        def edgeplug_passes(self):
            for spec in specs:
                yield edgeplug.PassSpec(**{"backend": "regtest", "stage": "edge", "fn": print, **spec})

    return Passes()


def test_passes_run_in_the_order_their_constraints_give_then_by_order(edgeplug_register):
    edgeplug_register(_backend_plugin(), name="regtest")
    edgeplug_register(
        _passes(
            {"name": "c", "order": 0},
            {"name": "a", "before": ("c",), "order": 9},
            {"name": "b", "after": "a", "before": ("c",), "order": -1},
            {"name": "d", "order": -3},
            {"name": "x", "stage": "export"},
        ),
        name="third-party",
    )
    b = edgeplug.get_backend("regtest")
    # a before b before c by constraint; d has none, so order -3 puts it first
    assert [p.name for p in b.passes_for("edge")] == ["d", "a", "b", "c"]
    assert [p.name for p in b.passes_for("export")] == ["x"]
    assert b.origin(b.passes_for("edge")[0]).name == "third-party"


@pytest.mark.parametrize(
    "specs, expected",
    [
        (
            [{"name": "a", "after": ("b",)}, {"name": "b", "after": ("c",)}, {"name": "c", "after": ("a",)}],
            "form a cycle: 'c' (plugin 'p' (registered in code)) -> 'b' (plugin 'p' (registered in code)) -> "
            "'a' (plugin 'p' (registered in code)) -> 'c'",
        ),
        ([{"name": "fold", "after": ("fuse_norms",)}, {"name": "fuse_norm"}], "must run after 'fuse_norms', which is no pass of backend 'regtest' (did you mean 'fuse_norm'?)"),
        ([{"name": "a", "before": ("b",)}, {"name": "b", "stage": "export"}], "constrained against 'b', which runs in the export stage"),
        ([{"name": "a"}, {"name": "a", "stage": "export"}], "two passes named 'a' on backend 'regtest': from plugin 'p' (registered in code) and from plugin 'p'"),
    ],
    ids=["cycle", "unknown-name", "across-stages", "duplicate-name"],
)
def test_bad_pass_constraints_make_only_their_backend_unavailable(edgeplug_register, specs, expected):
    edgeplug_register(_backend_plugin(), name="regtest")
    edgeplug_register(_passes(*specs), name="p")
    with pytest.warns(PluginWarning, match="backend 'regtest' is unavailable"):
        names = edgeplug.backends()
    assert "regtest" not in names and names  # the other backends stay available
    with pytest.raises(PluginConflictError) as err:
        edgeplug.get_backend("regtest")
    assert expected in str(err.value)
    assert "edgeplug.unregister_plugin('p')" in str(err.value)


def test_two_fusion_policies_for_one_pattern_make_the_backend_unavailable(fixture_site, fixture_backends, edgeplug_register):
    class SecondPolicy:
        @edgeplug.hookimpl
        def edgeplug_fusion_policies(self):
            yield edgeplug.FusionPolicy(backend="tinycpu", target="aten.rms_norm")

    fixture_site("good")
    edgeplug_register(SecondPolicy(), name="second-policy")
    with pytest.warns(PluginWarning):
        assert "tinycpu" not in edgeplug.backends()
    with pytest.raises(PluginConflictError) as err:
        edgeplug.get_backend("tinycpu")
    msg = str(err.value)
    assert "two fusion policies for pattern 'rms_norm' on backend 'tinycpu'" in msg
    assert "distribution edgeplug-fixture-good (plugin 'tinycpu')" in msg and "plugin 'second-policy'" in msg
    assert edgeplug.get_backend(fixture_backends.TABLE).name == fixture_backends.TABLE  # the others stay available


@pytest.mark.parametrize(
    "policy, message",
    [
        ({"target": "aten.rms_nrm"}, "target 'aten.rms_nrm' is not a registered operator (give load_target"),
        ({"target": "aten.rms_norm", "arguments": ("input", "weight", "eps")}, "fix FusionPolicy.arguments"),
    ],
)
def test_a_fusion_policy_whose_target_cannot_be_emitted_is_refused_at_load(fixture_backends, edgeplug_register, policy, message):
    class BadPolicy:
        @edgeplug.hookimpl
        def edgeplug_fusion_policies(self):
            yield edgeplug.FusionPolicy(backend="fixture-table", **policy)

    edgeplug_register(BadPolicy(), name="bad-policy")
    with pytest.warns(PluginWarning):
        assert "fixture-table" not in edgeplug.backends()
    with pytest.raises(PluginConflictError) as err:
        edgeplug.get_backend("fixture-table")
    msg = str(err.value)
    assert "the rms_norm fusion policy from plugin 'bad-policy' (registered in code) cannot be emitted" in msg
    assert message in msg and "edgeplug.unregister_plugin('bad-policy')" in msg


# -- loud misuse (issue 11) -----------------------------------------------------------


def test_a_hook_without_the_marker_is_reported(fixture_site):
    fixture_site("misuse")
    with pytest.warns(PluginWarning):
        assert "unmarked" not in edgeplug.backends()
    msg = _problem("unmarked")
    assert "distribution edgeplug-fixture-misuse 0.8.0" in msg
    assert "function edgeplug_keep_whole is not marked @edgeplug.hookimpl, so it would never be called" in msg
    assert "EDGEPLUG_DISABLE_PLUGINS=unmarked" in msg


def test_an_unmarked_misspelt_hook_says_so(edgeplug_register):
    class Helper:
        def edgeplug_backend(self):  # misspelt and unmarked
            return []

    edgeplug_register(Helper(), name="helper")
    with pytest.warns(PluginWarning):
        edgeplug.backends()
    assert "and names no hook (the hooks are: edgeplug_backends, edgeplug_keep_whole" in _problem("helper")


def test_a_kernel_op_name_that_never_matches_is_refused_at_load(fixture_site):
    fixture_site("misuse")
    with pytest.warns(PluginWarning):
        assert "badkernel" not in edgeplug.backends()
    msg = _problem("badkernel")
    assert "invalid Kernel record from hook edgeplug_kernels: field 'op' = 'aten::linear': Value error, op 'aten::linear' is not written namespace.name.overload" in msg
    assert "'aten.linear.default'" in msg


@pytest.mark.parametrize(
    "op, message",
    [
        ("aten.linear", "e.g. 'aten.linear.default'"),
        ("aten.lienar.default", "op 'aten.lienar.default' is not a registered operator (torch.ops.aten.lienar.default); did you mean 'aten.linear.default'?"),
        ("aten.linear.Tensor", "is not a registered operator"),
    ],
)
def test_kernel_op_names_resolve_against_the_op_registry(op, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as err:
        edgeplug.Kernel(backend="x", op=op, impl=print, device="cpu")
    assert message in str(err.value)
    assert edgeplug.Kernel(backend="x", op="aten.add.Tensor", impl=print).op == "aten.add.Tensor"


def test_records_for_a_backend_no_plugin_registers_are_reported(fixture_site):
    fixture_site("misuse")
    with pytest.warns(PluginWarning, match="toyacel"):
        assert "toyaccel" in edgeplug.backends()
    (unclaimed,) = plugins.unclaimed()
    msg = unclaimed.message
    assert "plugin 'toyaccel' (entry point 'toyaccel = edgeplug_fixture_misuse.toyaccel'" in msg
    assert "yields a FusionPolicy for backend 'toyacel', which no loaded plugin registers" in msg
    assert "Did you mean 'toyaccel'?" in msg
    assert edgeplug.get_backend("toyaccel").fusion_policies == ()


def test_old_names_warn_for_one_api_then_fail_naming_the_new_one(edgeplug_register, monkeypatch):
    """An old spelling (edgeplug._api.RENAMES) works for one API with a warning naming the new one, then
    fails naming it; names that were never part of the author's API stay gone."""
    from pydantic import ValidationError

    from edgeplug import _api

    new_name = r"`BackendSpec\(verify=\)` is now `BackendSpec\(verify_method=\)`"
    with pytest.warns(_api.PluginApiDeprecationWarning, match=new_name + r" \(deprecated in plugin API 1"):
        spec = edgeplug.BackendSpec(backend="x", description="d", backend_id="X", partitioner=list, verify="pte")
    assert spec.verify_method == "pte" and not hasattr(spec, "verify")
    with pytest.raises(AttributeError, match="SkipDecomp"):
        edgeplug.SkipDecomp  # noqa: B018
    assert not hasattr(edgeplug.get_backend(edgeplug.backends()[0]), "skip_ops")
    assert not hasattr(plugins.manager(), "records")

    monkeypatch.setattr(_api, "current", _api.API_VERSION + 1)  # the next release: these spellings removed
    with pytest.raises(ValidationError, match=new_name + r" \(removed in plugin API 2, edgeplug 0.2\)"):
        edgeplug.BackendSpec(backend="x", description="d", backend_id="X", partitioner=list, verify="pte")

    class OldHook:
        @edgeplug.hookimpl
        def edgeplug_skip_decomp(self):
            return []

    edgeplug_register(OldHook(), name="old-hook")
    with pytest.warns(PluginWarning):
        edgeplug.backends()
    msg = _problem("old-hook")
    assert "failed at the plugin API check: it uses spellings removed in plugin API 2" in msg
    assert "`edgeplug_skip_decomp` is now `edgeplug_keep_whole` (removed in plugin API 2, edgeplug 0.2)" in msg


# -- `edgeplug plugins` --------------------------------------------------------------


def _plugin_block(out: str, name: str) -> str:
    blocks = re.split(r"(?m)^(?=\S)", out)
    found = [b for b in blocks if b.startswith(f"{name}: ")]
    assert len(found) == 1, out
    return found[0]


def test_plugins_command_shows_status_and_what_each_adds_to_which_backend(cli, fixture_site, fixture_backends, monkeypatch):
    fixture_site("good", "broken_import", "misuse", "hook_raises", "adds_to_table")
    monkeypatch.setenv("EDGEPLUG_DISABLE_PLUGINS", "raiser")
    code, out, _ = cli("plugins")
    assert code == 0
    good = _plugin_block(out, "tinycpu")
    assert "tinycpu: edgeplug-fixture-good 1.2.3\n  entry point  tinycpu = edgeplug_fixture_good.hooks\n  status       loaded\n" in good
    assert "  adds to backend 'tinycpu'\n    the backend itself (delegate TinyCpuBackend, verify: kernels)\n" in good
    assert "    kernel aten.gelu.default (cpu)\n" in good and "    edge pass 'early'\n" in good
    # a record added to another plugin's backend says whose backend it is
    assert (
        "  adds to backend 'fixture-table' (added to a backend of plugin 'edgeplug-fixture-backends' (registered in code))\n"
        "    keep whole: aten.pixel_shuffle.default\n"
    ) in _plugin_block(out, "tableaddon")
    broken = _plugin_block(out, "brokenimport")
    assert "status       broken: failed at import: ModuleNotFoundError: No module named 'edgeplug_fixture_vendor_sdk'" in broken
    assert re.search(r"raised at \S*edgeplug_fixture_broken/hooks\.py:\d+ in <module>", broken), broken
    assert "status       blocked: blocked by EDGEPLUG_DISABLE_PLUGINS=raiser" in _plugin_block(out, "raiser")
    toy = _plugin_block(out, "toyaccel")
    assert "adds to backend 'toyacel' (ignored: " in toy and "Did you mean 'toyaccel'?" in toy
    assert "status       broken: failed at registration: function edgeplug_keep_whole is not marked" in _plugin_block(out, "unmarked")


def test_plugins_command_names_the_conflict_on_the_contested_backend_only(cli, fixture_site):
    import json

    fixture_site("good", "conflict_backend")
    code, out, _ = cli("plugins", "--json")
    assert code == 0
    rows = {r["plugin"]: r for r in json.loads(out)}
    assert rows["tinycpuclone"]["status"] == "loaded" and rows["tinycpuclone"]["distribution"] == "edgeplug-fixture-tinycpu-clone"
    assert "backend 'tinycpu' is registered twice" in rows["tinycpuclone"]["trouble"]["tinycpu"]
    assert "backend 'tinycpu' is registered twice" in rows["tinycpu"]["trouble"]["tinycpu"]
    others = [r for name, r in rows.items() if name not in ("tinycpu", "tinycpuclone") and r["status"] == "loaded"]
    assert others and all(r["trouble"] == {} for r in others)


def test_backends_command_fails_when_every_plugin_is_skipped(cli, fixture_site, monkeypatch):
    fixture_site("good")
    monkeypatch.setenv("EDGEPLUG_PLUGINS", "nothing-by-this-name")
    code, out, err = cli("backends")
    assert code == 1 and out == ""  # no table header over nothing
    assert "no backend is available: every plugin is skipped (see above)" in err
    assert "skipped plugin 'tinycpu' (edgeplug-fixture-good): not in EDGEPLUG_PLUGINS=nothing-by-this-name" in err
