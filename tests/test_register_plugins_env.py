"""``EDGEPLUG_REGISTER_PLUGINS``: plugins without a distribution, registered in every process that has the variable.

``edgeplug.register_plugin`` reaches one process; a zoo cell's process or a Ray
worker sees installed distributions only. The variable names modules
(``MODULE`` or ``MODULE:OBJECT``, comma-separated) that every registry imports
and registers as ``register`` would. Here: it loads, it is explicit (the
allow-list does not filter it, the block-list does), a module registered both
ways loads once, a change of the variable is seen, and each way it can be
wrong is a plugin problem saying what to fix while the other plugins load.
Across processes it is exercised by the zoo's executor tests (tests/test_zoo.py:
every cell there runs on a fixture backend in a process of its own).
"""

from __future__ import annotations

import warnings

import pytest

from edgeplug._backend import backend_names
from edgeplug._registry import ENV_REGISTER, PluginManager

FIXTURE = "edgeplug_fixture_backends"


@pytest.fixture
def registry(monkeypatch, clean_plugin_env):
    """A registry of its own that loads no entry point (only what is registered or named)."""
    monkeypatch.setenv("EDGEPLUG_PLUGINS", "no-entry-point-plugin")
    monkeypatch.delenv(ENV_REGISTER, raising=False)
    return PluginManager()


def _load(m: PluginManager) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the problems are read from m.problems()
        return backend_names(m)


def test_a_named_module_loads_and_says_where_it_came_from(registry, monkeypatch, tmp_path):
    import edgeplug_fixture_backends as fb

    assert _load(registry) == []
    monkeypatch.setenv(ENV_REGISTER, f" {FIXTURE} ")
    assert _load(registry) == sorted(fb.ALL)  # a change of the variable is seen without reset()
    [info] = registry.plugins()
    assert info.named_in_env and info.describe() == f"plugin {FIXTURE!r} (named in {ENV_REGISTER})"
    assert not registry.problems()
    (tmp_path / "holder_of_plugins.py").write_text(f"import {FIXTURE} as backends\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV_REGISTER, "holder_of_plugins:backends")  # MODULE:OBJECT
    assert _load(registry) == sorted(fb.ALL)
    assert [p.name for p in registry.plugins()] == ["holder_of_plugins:backends"]


def test_named_and_registered_in_process_loads_once(registry, monkeypatch):
    import edgeplug_fixture_backends as fb

    registry.register(fb, "edgeplug-fixture-backends")
    monkeypatch.setenv(ENV_REGISTER, FIXTURE)
    assert _load(registry) == sorted(fb.ALL)  # no backend registered twice
    assert not registry.conflicts() and len(registry.plugins()) == 1


def test_the_allow_list_does_not_filter_it_and_the_block_list_does(registry, monkeypatch):
    import edgeplug_fixture_backends as fb

    monkeypatch.setenv(ENV_REGISTER, FIXTURE)
    assert _load(registry) == sorted(fb.ALL)  # EDGEPLUG_PLUGINS (set by the fixture) names no such plugin
    monkeypatch.setenv("EDGEPLUG_DISABLE_PLUGINS", FIXTURE.replace("_", "-"))
    assert _load(registry) == []
    [why] = [why for info, why in registry.skipped() if info.name == FIXTURE]  # the others: not allowed
    assert why == f"blocked by EDGEPLUG_DISABLE_PLUGINS={FIXTURE.replace('_', '-')}"


@pytest.mark.parametrize(
    "entry, words",
    [
        ("no_such_plugin_module", [
            "names module 'no_such_plugin_module', which this Python cannot find",
            "put the folder that holds it on PYTHONPATH",
        ]),
        (f"{FIXTURE}:no_such_object", [
            f"module {FIXTURE!r} has no attribute 'no_such_object'", "fix the OBJECT after the colon",
        ]),
        ("edgeplug-fixture-backends", ["is not MODULE or MODULE:OBJECT", "fix the variable"]),
    ],
)
def test_an_entry_that_names_nothing_importable_is_a_problem_saying_what_to_fix(registry, monkeypatch, entry, words):
    import edgeplug_fixture_backends as fb

    monkeypatch.setenv(ENV_REGISTER, f"{entry},{FIXTURE}")
    assert _load(registry) == sorted(fb.ALL)  # the good entry still loads
    [problem] = registry.problems()
    message = problem.message
    assert message.startswith(f"plugin {entry!r} (named in {ENV_REGISTER}) failed at import: "), message
    for word in words:
        assert word in message, message
    assert f"take it out of {ENV_REGISTER}" in message, message


def test_a_module_that_raises_on_import_is_located_in_its_own_code(registry, monkeypatch, tmp_path):
    (tmp_path / "raising_plugin.py").write_text("import os\n\nraise RuntimeError('no device here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV_REGISTER, "raising_plugin")
    assert _load(registry) == []
    [problem] = registry.problems()
    assert "RuntimeError: no device here (raised at " in problem.message
    assert f"{tmp_path / 'raising_plugin.py'}:3" in problem.message, problem.message
