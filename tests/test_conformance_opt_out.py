"""A backend opts out of a conformance test by name, with a reason, and the author's guide lists every test.

``EDGEPLUG_CONFORMANCE_OPT_OUT = {"test_name": "why"}`` in the module that imports the suite skips that test,
the run saying why; a name that is no conformance test, or no reason, stops the run at collection (a usage
error, exit code 4).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from edgeplug.testing import conformance
from edgeplug.testing.plugin import _opt_outs

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
GUIDE = ROOT / "docs" / "writing-a-backend.md"

MODULE = '''
from edgeplug.testing.conformance import *  # noqa: F401,F403

EDGEPLUG_BACKENDS = ["tinycpu"]
EDGEPLUG_CONFORMANCE_OPT_OUT = {OPT_OUT}
'''


def _run_suite(tmp_path: Path, opt_out: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_backend.py").write_text(MODULE.replace("{OPT_OUT}", opt_out))
    env = dict(os.environ, PYTHONPATH=str(FIXTURES / "good"))  # edgeplug-fixture-good: backend tinycpu
    for var in ("EDGEPLUG_PLUGINS", "EDGEPLUG_DISABLE_PLUGINS", "EDGEPLUG_REGISTER_PLUGINS"):
        env.pop(var, None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "test_backend.py",
         "-k", "loaded_without_problems or backend_spec"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )


def test_an_opted_out_test_is_skipped_saying_why(tmp_path):
    proc = _run_suite(tmp_path, '{"test_backend_spec": "upstream issue 1234: its partitioner cannot be built twice"}')
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert re.search(r"^1 passed, 1 skipped, \d+ deselected\b", proc.stdout.strip().splitlines()[-1]), proc.stdout[-800:]
    assert "opted out (EDGEPLUG_CONFORMANCE_OPT_OUT): upstream issue 1234: its partitioner cannot be built twice" in proc.stdout


def _module(opt_out):
    module = types.ModuleType("test_mynpu")
    module.__file__ = "tests/test_mynpu.py"
    for name in conformance.__all__:  # what `from edgeplug.testing.conformance import *` brings
        setattr(module, name, getattr(conformance, name))
    module.EDGEPLUG_CONFORMANCE_OPT_OUT = opt_out
    return module


def test_an_opt_out_naming_no_test_or_giving_no_reason_stops_the_run():
    reason = "upstream issue 1234"
    assert _opt_outs(_module({"test_backend_spec": reason})) == {"test_backend_spec": reason}
    with pytest.raises(pytest.UsageError, match=r"tests/test_mynpu.py: EDGEPLUG_CONFORMANCE_OPT_OUT names "
                       r"'test_backend_specs', which is no conformance test this module runs \(they are: .*test_backend_spec,"):
        _opt_outs(_module({"test_backend_specs": reason}))
    for empty in ("  ", None):
        with pytest.raises(pytest.UsageError, match=r"\['test_backend_spec'\] must say why the backend opts out"):
            _opt_outs(_module({"test_backend_spec": empty}))
    with pytest.raises(pytest.UsageError, match="must be a dict of conformance test name -> reason, not list"):
        _opt_outs(_module(["test_backend_spec"]))
    bare = _module({"test_backend_spec": reason})
    del bare.test_backend_spec  # the suite not imported: nothing to opt out of
    with pytest.raises(pytest.UsageError, match="which is no conformance test this module runs"):
        _opt_outs(bare)


def test_the_authors_guide_lists_every_conformance_test():
    text = GUIDE.read_text()
    section = text[text.index("## The conformance suite"):]
    section = section[: section.index("\n## ", 5)]
    # every test the suite runs: what `import *` brings (__all__) and what `--pyargs` collects (every test_ function)
    suite = {*conformance.__all__, *(n for n in vars(conformance) if n.startswith("test_") and callable(getattr(conformance, n)))}
    missing = sorted(name for name in suite if f"`{name}`" not in section)
    assert missing == [], f"docs/writing-a-backend.md's conformance section does not list {missing}"
    assert "EDGEPLUG_CONFORMANCE_OPT_OUT" in section
