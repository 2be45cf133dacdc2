"""A plugin that registers a backend name an installed plugin already serves (issue 47): the conflict's advice
takes out the newcomer, never the installed owner (here the installed edgeplug-xnnpack, cloned by name)."""

from __future__ import annotations

import pytest

import edgeplug
from edgeplug._registry import PluginWarning
from edgeplug._registry import lookup as plugins


class _Clone:
    """A plugin that registers backend 'xnnpack' again (what a clone or a fork added in code does)."""

    @staticmethod
    def _spec():
        from edgeplug.plugin import BackendSpec

        return BackendSpec(backend="xnnpack", description="a clone", backend_id="XnnpackBackend",
                           partitioner=lambda: None, verify_method="none")


def _clone_hooks():
    from edgeplug.plugin import hookimpl

    class Clone(_Clone):
        @hookimpl
        def edgeplug_backends(self):
            yield self._spec()

    return Clone()


def test_a_registered_clone_of_an_installed_backend_is_the_one_the_advice_takes_out(edgeplug_register, monkeypatch):
    edgeplug_register(_clone_hooks(), name="xnn-clone")
    with pytest.warns(PluginWarning):
        assert "xnnpack" not in edgeplug.backends()
    (conflict,) = [c for c in plugins.conflicts() if c.backend == "xnnpack"]
    assert conflict.newcomer.name == "xnn-clone"
    assert "EDGEPLUG_DISABLE_PLUGINS=xnnpack" not in conflict.message  # that would take out edgeplug-xnnpack
    assert "edgeplug.unregister_plugin('xnn-clone')" in conflict.message


def test_a_clone_named_in_the_register_variable_is_the_one_the_advice_takes_out(monkeypatch, tmp_path):
    (tmp_path / "xnn_clone_env.py").write_text(
        "from edgeplug.plugin import BackendSpec, hookimpl\n"
        "@hookimpl\n"
        "def edgeplug_backends():\n"
        "    yield BackendSpec(backend='xnnpack', description='a clone', backend_id='XnnpackBackend',\n"
        "                      partitioner=lambda: None, verify_method='none')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("EDGEPLUG_REGISTER_PLUGINS", "xnn_clone_env")
    plugins.reset()
    try:
        with pytest.warns(PluginWarning):
            assert "xnnpack" not in edgeplug.backends()
        (conflict,) = [c for c in plugins.conflicts() if c.backend == "xnnpack"]
        assert "EDGEPLUG_DISABLE_PLUGINS=xnnpack" not in conflict.message
        assert "take 'xnn_clone_env' out of EDGEPLUG_REGISTER_PLUGINS" in conflict.message
        monkeypatch.delenv("EDGEPLUG_REGISTER_PLUGINS")  # the advice followed: the installed plugin serves again
        plugins.reset()
        assert "xnnpack" in edgeplug.backends()
        assert edgeplug.get_backend("xnnpack").distribution == "edgeplug-xnnpack"
    finally:
        plugins.reset()
