"""pytest plugin for edgeplug backends (registered through the ``pytest11`` entry point).

Loaded by every pytest run in an environment where edgeplug is installed, so
importing it stays cheap: no torch, no executorch, no plugin discovery. See
``edgeplug.testing`` for the fixtures and how to run the conformance suite.
"""

from __future__ import annotations

import importlib
import socket
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

import edgeplug

OPTION = "--edgeplug-backend"
INI = "edgeplug_backends"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("edgeplug")
    group.addoption(
        OPTION,
        action="append",
        default=[],
        metavar="NAME",
        help="run edgeplug's backend-parametrised tests (the conformance suite) for this "
        "backend only; repeatable (default: every installed backend)",
    )
    parser.addini(INI, type="args", default=[], help="backends the edgeplug conformance suite runs for")


def selected_backends(config: pytest.Config) -> list[str]:
    """Backends named with --edgeplug-backend / the ini option, else every installed one."""
    names = list(config.getoption(OPTION) or []) or list(config.getini(INI) or [])
    if names:
        return names

    return edgeplug.backends()


#: A test module may pin the backends its tests run for: ``EDGEPLUG_BACKENDS = ["mybackend"]``.
MODULE_ATTR = "EDGEPLUG_BACKENDS"


#: A test module may opt its backend out of conformance tests, each by name with the reason (an upstream bug
#: of the backend's own library, with its link): ``EDGEPLUG_CONFORMANCE_OPT_OUT = {"test_x": "why"}``.
OPT_OUT_ATTR = "EDGEPLUG_CONFORMANCE_OPT_OUT"
CONFORMANCE = "edgeplug.testing.conformance"


def _opt_outs(module: Any) -> dict[str, str]:
    """The module's opt-outs, checked: each names a conformance test and gives a reason (else a usage error)."""
    opted = getattr(module, OPT_OUT_ATTR, None)
    if opted is None:
        return {}
    where = getattr(module, "__file__", None) or getattr(module, "__name__", "?")
    if not isinstance(opted, dict):
        raise pytest.UsageError(
            f"{where}: {OPT_OUT_ATTR} must be a dict of conformance test name -> reason, not {type(opted).__name__}"
        )
    # the suite's names, from the module that imported it (this plugin must not import torch to learn them)
    suite = {n for n, f in vars(module).items() if getattr(f, "__module__", None) == CONFORMANCE and n.startswith("test_")}
    for name, reason in opted.items():
        if name not in suite:
            raise pytest.UsageError(
                f"{where}: {OPT_OUT_ATTR} names {name!r}, which is no conformance test this module runs "
                f"(they are: {', '.join(sorted(suite)) or 'none: import them with from edgeplug.testing.conformance import *'})"
            )
        if not isinstance(reason, str) or not reason.strip():
            raise pytest.UsageError(
                f"{where}: {OPT_OUT_ATTR}[{name!r}] must say why the backend opts out (a non-empty string, e.g. the "
                "upstream issue that makes it fail), not {reason!r}"
            )
    return dict(opted)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Conformance tests a module opted out of are skipped, the report saying why (``OPT_OUT_ATTR``)."""
    checked: dict[int, dict[str, str]] = {}
    for item in items:
        module = getattr(item, "module", None)
        if module is None:
            continue
        if id(module) not in checked:
            checked[id(module)] = _opt_outs(module)
        reason = checked[id(module)].get(getattr(item, "originalname", item.name))
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"opted out ({OPT_OUT_ATTR}): {reason}"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "edgeplug_backend_name" in metafunc.fixturenames:
        pinned = getattr(metafunc.module, MODULE_ATTR, None)
        names = list(pinned) if pinned is not None else selected_backends(metafunc.config)
        metafunc.parametrize("edgeplug_backend_name", names, ids=names, scope="session")


@pytest.fixture
def edgeplug_backend(edgeplug_backend_name: str) -> Any:
    """The resolved ``Backend`` for the current backend parameter; skipped, with the backend's own reason, where
    it cannot even partition here (``Availability.dry_run`` False: e.g. the installed ExecuTorch lacks its
    partitioner), since every lowering is then refused before any work."""
    backend = edgeplug.get_backend(edgeplug_backend_name)
    a = backend.availability()
    if not a.ok and not a.dry_run:
        pytest.skip(f"backend {backend.name!r} cannot partition here: {a.reason}")
    return backend


class LoweringCache:
    """Lowers each (example, backend, dry_run) once per session; failures are cached too."""

    def __init__(self) -> None:
        self._results: dict[tuple[str, str, bool], Any] = {}
        self._verified: dict[tuple[str, str, bool], Any] = {}

    def __call__(
        self, example: str, backend: str, *, dry_run: Optional[bool] = None, verify: bool = False
    ) -> Any:
        # every pytest run imports this plugin: the examples' loader waits for a test that asks
        from edgeplug.examples import load_model

        b = edgeplug.get_backend(backend)
        if dry_run is None:
            dry_run = not b.availability().ok
        key = (example, b.name, dry_run)
        if key not in self._results:
            try:
                model, inputs, _, label = load_model(example)
                self._results[key] = edgeplug.lower(model, inputs, b, dry_run=dry_run, model_name=label)
            except Exception as exc:
                self._results[key] = exc
        result = self._results[key]
        if isinstance(result, Exception):
            raise result
        if verify and result.report.verification is None:
            if key not in self._verified:
                try:
                    self._verified[key] = edgeplug.verify(result, b)
                except Exception as exc:
                    self._verified[key] = exc
            if isinstance(self._verified[key], Exception):
                raise self._verified[key]
            result.report.verification = self._verified[key]
        return result


@pytest.fixture(scope="session")
def edgeplug_lowering() -> LoweringCache:
    """``edgeplug_lowering(example, backend, *, dry_run=None, verify=False) -> LoweringResult``."""
    return LoweringCache()


def _reset_plugins() -> None:
    # every pytest run imports this plugin: the plugin manager waits for a test that asks
    from edgeplug._registry import lookup as plugins

    plugins.reset()


@pytest.fixture
def edgeplug_site(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str | Path], Path]]:
    """Put a folder of installed distributions first on ``sys.path`` for one test."""
    sites: list[Path] = []

    def activate(site: str | Path) -> Path:
        site = Path(site).resolve()
        monkeypatch.syspath_prepend(str(site))
        importlib.invalidate_caches()
        sites.append(site)
        _reset_plugins()
        return site

    yield activate
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if origin and any(Path(origin).resolve().is_relative_to(s) for s in sites):
            del sys.modules[name]
    _reset_plugins()  # discovered again (without these sites) on next use


@pytest.fixture
def edgeplug_register() -> Iterator[Callable[..., Any]]:
    """Register hookimpls (a module or object) for one test; unregistered afterwards."""
    # every pytest run imports this plugin: the plugin manager waits for a test that asks
    from edgeplug._registry import lookup as plugins

    added: list[object] = []

    def register(plugin: object, name: Optional[str] = None) -> Any:
        added.append(plugin)
        return plugins.register(plugin, name)

    yield register
    for plugin in added:
        plugins.unregister(plugin)


@pytest.fixture
def edgeplug_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[Any, str, str]]:
    """``edgeplug_cli("lower", "mlp", "-b", "mybackend")`` runs the ``edgeplug`` command in this process and
    returns (exit code, stdout, stderr); an argparse usage error gives its exit code too."""
    # every pytest run imports this plugin: the CLI (its commands, the report) waits for a test that asks
    from edgeplug._cli import main

    def run(*argv: Any) -> tuple[Any, str, str]:
        capsys.readouterr()
        try:
            code: Any = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse usage errors
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


#: the variables that change which plugins load and how errors print
PLUGIN_VARIABLES = ("EDGEPLUG_PLUGINS", "EDGEPLUG_DISABLE_PLUGINS", "EDGEPLUG_REGISTER_PLUGINS", "EDGEPLUG_DEBUG")


@pytest.fixture
def edgeplug_plain_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """None of EDGEPLUG_PLUGINS, EDGEPLUG_DISABLE_PLUGINS, EDGEPLUG_REGISTER_PLUGINS, EDGEPLUG_DEBUG from the
    caller's shell for one test; plugins are discovered again at the test's first use (so a variable the test
    sets is seen) and again after it (so the next test does not see it)."""
    for var in PLUGIN_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    _reset_plugins()
    yield
    _reset_plugins()  # lazily: discovery happens at the next use, once the variables are restored


@pytest.fixture
def edgeplug_no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Refuses every socket connection and name lookup for one test and returns the list of attempts
    (empty when nothing tried the network), e.g. to show a quantizer factory builds offline."""
    attempts: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> None:
        attempts.append(repr(args[1:] or args)[:120])
        raise OSError("networking is disabled in this test (edgeplug_no_network)")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts
