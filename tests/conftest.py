"""Shared fixtures of the core's tests.

The pytest plugin ``edgeplug.testing.plugin`` (loaded through its entry point)
adds ``edgeplug_lowering`` (session-cached lowerings), ``edgeplug_site``
(activate a folder of installed distributions), ``edgeplug_register`` and the
backend parametrisation. The fixtures below build on them; the expensive ones
are session-scoped and only built when a test asks for them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent
#: folders each holding installed test distributions (*.dist-info + modules)
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# the core's test backends (a plain module, no dist-info: nothing discovers it unless registered)
sys.path.insert(0, str(FIXTURES / "backends"))


@pytest.fixture
def fixture_backends() -> Iterator[Any]:
    """The core's test backends (fixture-keep, fixture-fused, fixture-table, fixture-offline), registered
    for one test; the module is returned (its constants name the backends, ops, filter and pass).
    Session fixtures use ``edgeplug_fixture_backends.registered()`` (a context manager) instead."""
    import edgeplug_fixture_backends

    with edgeplug_fixture_backends.registered() as fb:
        yield fb


@pytest.fixture
def clean_plugin_env(monkeypatch):
    """No EDGEPLUG_PLUGINS / EDGEPLUG_DISABLE_PLUGINS / EDGEPLUG_REGISTER_PLUGINS from the caller's shell."""
    monkeypatch.delenv("EDGEPLUG_PLUGINS", raising=False)
    monkeypatch.delenv("EDGEPLUG_DISABLE_PLUGINS", raising=False)
    monkeypatch.delenv("EDGEPLUG_REGISTER_PLUGINS", raising=False)


@pytest.fixture
def fixture_site(edgeplug_site, clean_plugin_env):
    """``fixture_site("good")`` installs the test distributions in tests/fixtures/good."""

    def activate(*names: str) -> Path:
        for name in names:
            path = FIXTURES / name
            assert path.is_dir(), f"no fixture site {name!r} in {FIXTURES}"
            edgeplug_site(path)
        return path

    return activate


@pytest.fixture
def cli(edgeplug_cli):
    """``edgeplug.testing``'s ``edgeplug_cli`` (run ``edgeplug ARGS...`` in this process: exit code, stdout, stderr)."""
    return edgeplug_cli


@pytest.fixture(scope="session")
def llama_example():
    """The built-in tiny Llama: (model, args)."""
    from edgeplug.examples import load_model

    model, inputs, _, _ = load_model("llama")
    return model, inputs


@pytest.fixture(scope="session")
def llama_exported(llama_example):
    """torch.export of the tiny Llama (aten dialect). Do not mutate it: copy first."""
    import torch

    model, inputs = llama_example
    return torch.export.export(model, inputs)


@pytest.fixture(scope="session")
def llama_edge(llama_exported):
    """The tiny Llama in edge dialect, as ``to_edge(...).exported_program()`` returns it."""
    from executorch.exir import EdgeCompileConfig, to_edge

    return to_edge(llama_exported, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()


@pytest.fixture(scope="session")
def zoo():
    """``edgeplug._zoo``: the built-in tiny transformers models (build, exported), the stock lowering, run_cell."""
    import edgeplug._zoo

    return edgeplug._zoo


#: Debian's chromium (the HTML report's browser tests drive it; never a downloaded browser)
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]


@pytest.fixture(scope="session")
def browser():
    """Debian's chromium driven by Playwright, one for the session (Playwright's sync API allows one
    per thread). Skips only where chromium is absent; playwright is a test dependency (the [test] extra)."""
    import shutil

    path = shutil.which("chromium") or CHROMIUM
    if not Path(path).exists():
        pytest.skip("Debian's chromium is not installed here (apt-get install -y chromium; .ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield b
        b.close()
