"""A plugin's two statements of its plugin API (``BackendSpec.api_version`` and its requirement on ``edgeplug``)
must agree: where they contradict (``api_version=1`` with ``Requires-Dist: edgeplug>=0.2``) one of them is wrong, and
the plugin is refused in one line naming both and what to do. Before, it loaded silently by ``api_version``.
"""

from __future__ import annotations

import edgeplug
from edgeplug.testing import write_distribution

HOOKS = '''
from edgeplug.plugin import BackendSpec, hookimpl


def _partitioner():
    raise RuntimeError("never built here")


@hookimpl
def edgeplug_backends():
    yield BackendSpec(backend="apinpu", description="d", backend_id="ApiNpuBackend", partitioner=_partitioner,
                      api_version=1)
'''


def _install(site, requires):
    write_distribution(site, "edgeplug-apinpu", files={"edgeplug_apinpu.py": HOOKS},
                       entry_points={"apinpu": "edgeplug_apinpu"}, requires=requires)


def test_contradicting_statements_refuse_the_plugin_naming_both(edgeplug_site, edgeplug_plain_env, tmp_path):
    _install(tmp_path, ("edgeplug>=0.2",))
    edgeplug_site(tmp_path)
    assert "apinpu" not in edgeplug.backends()
    problem = next(p for p in edgeplug.plugin_problems() if p.plugin.distribution == "edgeplug-apinpu")
    assert "BackendSpec.api_version says 1, its requirement 'edgeplug>=0.2' admits API 2 and later (API N is edgeplug 0.N)" in problem.message
    assert "Make them agree" in problem.message and "EDGEPLUG_DISABLE_PLUGINS=apinpu" in problem.message


def test_agreeing_statements_load(edgeplug_site, edgeplug_plain_env, tmp_path):
    _install(tmp_path, ("edgeplug>=0.1,<0.2",))
    edgeplug_site(tmp_path)
    assert "apinpu" in edgeplug.backends()
    assert not [p for p in edgeplug.plugin_problems() if p.plugin.distribution == "edgeplug-apinpu"]
