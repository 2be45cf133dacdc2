"""Testing edgeplug backends: a pytest plugin and the conformance suite.

Every backend, first-party or third-party, must pass the conformance suite in
``edgeplug.testing.conformance``: its records are valid, its keep-whole table holds
real operator overloads, its fusion policy (if it declares one) names a real
operator, the Llama example lowers for it (or, where its delegate cannot
serialize here, lowers as a dry run and the real lowering stops with an error
that says what to install), and no op it keeps whole is left on the CPU.

Running the suite for your plugin
---------------------------------
Installing ``edgeplug`` registers the pytest plugin ``edgeplug.testing.plugin``
(entry point ``pytest11``), so with your plugin installed::

    pytest --pyargs edgeplug.testing.conformance --edgeplug-backend mybackend

``--edgeplug-backend`` may be repeated; without it the suite runs over every
installed backend. To keep the suite in your own test run, import it into one
of your test modules and pin your backend there::

    # tests/test_backend.py of your plugin
    from edgeplug.testing.conformance import *  # noqa: F401,F403

    EDGEPLUG_BACKENDS = ["mybackend"]

Without ``EDGEPLUG_BACKENDS`` the imported tests run for the backends named
with ``--edgeplug-backend``, else in the ini option ``edgeplug_backends``
(``pytest.ini``/``pyproject.toml``), else for every installed backend. Every
first-party plugin's ``tests/test_backend.py`` does exactly this.

Fixtures the plugin provides (names start with ``edgeplug_``):

``edgeplug_backend_name``
    A backend name; a test that asks for it runs once per selected backend.
``edgeplug_backend``
    ``edgeplug.get_backend(edgeplug_backend_name)``.
``edgeplug_lowering``
    Session-scoped and cached: ``edgeplug_lowering("llama", "vulkan")`` returns
    the ``LoweringResult`` (a dry run where the backend's delegate cannot
    serialize here; pass ``dry_run=`` to choose); ``verify=True`` adds the
    numerical check. A lowering costs seconds, so tests share them.
``edgeplug_site``
    Activates a folder holding installed distributions (``*.dist-info`` with
    ``entry_points.txt``) for one test: it goes first on ``sys.path``, plugins
    are discovered again, and both are undone afterwards. Use it with
    ``write_distribution`` to test how your plugin behaves next to another.
``edgeplug_register``
    ``edgeplug_register(module_or_object)`` registers hookimpls for one test.
``edgeplug_cli``
    ``edgeplug_cli("lower", "mlp", "-b", "mybackend")`` runs the ``edgeplug``
    command in the test's process: (exit code, stdout, stderr).
``edgeplug_plain_env``
    None of EDGEPLUG_PLUGINS, EDGEPLUG_DISABLE_PLUGINS, EDGEPLUG_DEBUG from the
    caller's shell for one test; plugins are discovered again before and
    after it, so a variable the test sets takes effect and goes with it.
``edgeplug_no_network``
    Refuses every connection and name lookup for one test; the list of
    attempts it returns should stay empty.

Helpers for checking what the command says and writes: ``error_line``
(the one ``edgeplug: error:`` line), ``assert_no_traceback``,
``backends_row`` (a row of ``edgeplug backends``), ``delegate_ids`` (of a
``.pte``), ``files_under`` (what a command left in a folder); and
``pt2e_schemes`` (the PT2E quantization schemes a backend declares, with
their bits); ``program_cpu_ops`` and ``program_delegated_ops`` (what a
lowered program leaves to the CPU and hands to its delegates);
``write_unloadable_library`` (a shared library that is there but does not
load, for an SDK availability check).
``edgeplug.testing.faults.CorruptWeight`` is a plugin whose pass corrupts a
weight, for showing a check catches it; ``edgeplug.testing.programs`` holds
small programs for tests.

Kernel tests
------------
An op's kernel suite belongs to the plugins that implement the op: the
``et_vk.rms_norm`` kernels of vulkan and webgpu run
``edgeplug_vulkan_delegate.testing.RmsNormKernelSuite`` (distribution
``edgeplug-vulkan-delegate``); a third party implementing that op subclasses it
with its ``backend``. Installing ``edgeplug[testing]`` brings pytest.

This package imports nothing heavy: torch and executorch load only when a
fixture or test needs them.
"""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any, Mapping

__all__ = [
    "assert_no_traceback", "backends_row", "delegate_ids", "error_line", "files_under", "program_cpu_ops",
    "program_delegated_ops", "pt2e_schemes", "write_distribution", "write_unloadable_library",
]

#: how every error of the ``edgeplug`` command starts
ERROR_PREFIX = "edgeplug: error:"


def error_line(stderr: str) -> str:
    """The one line of ``stderr`` starting ``edgeplug: error:`` (asserts there is exactly one)."""
    lines = [line for line in stderr.splitlines() if line.startswith(ERROR_PREFIX)]
    assert len(lines) == 1, f"expected one line starting {ERROR_PREFIX!r} in stderr, found {len(lines)}:\n{stderr}"
    return lines[0]


def assert_no_traceback(stderr: str) -> None:
    """Asserts no Python traceback reached the user (the command prints one only with --debug)."""
    assert "Traceback (most recent call last)" not in stderr, stderr


def backends_row(stdout: str, backend: str) -> str:
    """The row of ``edgeplug backends``' table for ``backend`` (asserts there is one)."""
    rows = [row for row in stdout.splitlines() if row.split()[:1] == [backend]]
    assert rows, f"no row for backend {backend!r} in:\n{stdout}"
    return rows[0]


def delegate_ids(pte: bytes) -> set[str]:
    """The delegate ids (``BackendDetails.id``, e.g. ``"XnnpackBackend"``) of a serialized ``.pte``, as
    executorch reads it back."""
    # executorch: pytest imports this package at startup (the pytest11 plugin lives in it): it stays light
    from edgeplug import _executorch

    return _executorch.pte_delegate_ids(pte)


def program_cpu_ops(result: Any) -> list[str]:
    """The ops a lowered program's top-level graph calls (what the CPU runs), one entry a call, without the
    overload (``aten.atan2``: serialization turns ops into their out variants). ``result`` is what
    ``edgeplug.lower`` returned, not a dry run."""
    # op_name loads torch; pytest imports this package at startup (the pytest11 plugin lives in it): it stays light
    from edgeplug.plugin import op_name

    gm = result.program.exported_program().graph_module
    return [
        op_name(n.target).rsplit(".", 1)[0]
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target is not operator.getitem and "call_delegate" not in str(n.target)
    ]


def program_delegated_ops(result: Any) -> list[str]:
    """The ops inside a lowered program's delegates (``aten.mul.Tensor``), one entry a call, as each
    partition was handed to its backend."""
    # executorch: pytest imports this package at startup (the pytest11 plugin lives in it): it stays light
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    from edgeplug.plugin import op_name

    gm = result.program.exported_program().graph_module
    return [
        op_name(n.target)
        for _, lowered, _ in get_lowered_submodules(gm)
        for n in lowered.original_module.graph.nodes
        if n.op == "call_function"
    ]


def pt2e_schemes(backend: str) -> dict[str, tuple]:
    """``{scheme: (activation bits, weight bits, per channel)}`` of the PT2E quantization schemes ``backend``
    declares (``QuantScheme`` records); asserts every scheme it declares names it and has a description."""
    # pytest imports this package at startup (the pytest11 plugin lives in it): it stays light
    from edgeplug._quantize.quantize import schemes
    from edgeplug._registry.lookup import get_backend

    declared = schemes(get_backend(backend))
    bad = [s.scheme for s in declared if s.backend != backend or not s.description]
    assert not bad, f"schemes of {backend!r} naming another backend or without a description: {bad}"
    return {s.scheme: (s.activation_bits, s.weight_bits, s.per_channel) for s in declared if s.kind == "pt2e"}


def files_under(folder: str | Path) -> list[str]:
    """Every file below ``folder``, as sorted relative paths: to show a failed command left nothing behind."""
    folder = Path(folder)
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())



def write_distribution(
    site: str | Path,
    name: str,
    version: str = "0.1.0",
    *,
    files: Mapping[str, str],
    entry_points: Mapping[str, str],
    requires: tuple[str, ...] = ("edgeplug",),
) -> Path:
    """Install a distribution into the folder ``site`` the way pip would list it.

    ``files`` maps paths relative to ``site`` (``"my_plugin/hooks.py"``) to
    source text; ``entry_points`` maps plugin names to ``module[:attr]`` in
    the ``edgeplug`` group. Writes ``NAME-VERSION.dist-info`` with METADATA,
    entry_points.txt and RECORD, so ``importlib.metadata`` finds it once
    ``site`` is on ``sys.path``. Returns the ``.dist-info`` folder.
    """
    site = Path(site)
    for rel, text in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    folder = site / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True, exist_ok=True)
    meta = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        *(f"Requires-Dist: {r}" for r in requires),
    ]
    (folder / "METADATA").write_text("\n".join(meta) + "\n")
    eps = "[edgeplug]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (folder / "entry_points.txt").write_text(eps)
    record = [*files, *(f"{folder.name}/{n}" for n in ("METADATA", "entry_points.txt", "RECORD"))]
    (folder / "RECORD").write_text("".join(f"{r},,\n" for r in record))
    return folder


#: the library ``write_unloadable_library``'s copy needs, which no loader path has
MISSING_LIBRARY = "libqq0.so"


def write_unloadable_library(path: str | Path) -> Path:
    """Write a real shared library at ``path`` that does not load: it needs ``libqq0.so``, which is nowhere
    on the loader path (a copy of torch's ``libshm.so`` with its ``libc10.so`` dependency renamed). For
    showing that an SDK whose libraries are there but do not load makes a backend unavailable, with a
    reason naming the library and a hint naming LD_LIBRARY_PATH. Returns ``path``."""
    # torch: pytest imports this package at startup (the pytest11 plugin lives in it): it stays light
    import torch

    libshm = Path(torch.__file__).parent / "lib" / "libshm.so"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = libshm.read_bytes()
    assert b"libc10.so\0" in data, f"{libshm} does not name libc10.so: torch's layout changed"
    path.write_bytes(data.replace(b"libc10.so\0", MISSING_LIBRARY.encode() + b"\0"))
    return path
