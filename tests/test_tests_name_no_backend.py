"""The core's tests name no first-party backend: they lower to tests/fixtures/backends.

Rule, for every text file under tests/ (test modules, conftest, fixtures,
snapshots): no word naming a first-party backend or its vendor, in code,
strings, docstrings or comments alike. What is specific to one backend is
tested in ``plugins/<backend>/tests`` (``make test`` runs ``tests plugins``);
what the core does for every backend is tested against the fixture backends
(``fixture_backends`` in tests/conftest.py).

``PENDING`` lists the files that still name one, each with where its
backend-specific part belongs: a strict xfail, so an entry must go as soon
as its file is clean. ``ALLOWED`` lists the files that must name a backend
for a reason that is not backend behaviour.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
FIRST_PARTY = re.compile(r"vulkan|et_vk|webgpu|xnnpack|qnn|samsung|coreml|qualcomm|exynos", re.IGNORECASE)
TEXT = {".py", ".txt", ".md", ".toml", ".cfg", ".json", ".ini"}

#: file (relative to tests/) -> why it must name a first-party backend
ALLOWED: dict[str, str] = {
    # this file: the pattern above
    "test_tests_name_no_backend.py": "the rule's own pattern",
    # the core's rule: its pattern, its probes and its allow-list name the backends it forbids
    "test_core_backend_neutral.py": "the core neutrality rule's pattern, probes and allow-list",
    # wgpu's vocabulary: "Vulkan" is the graphics API an adapter runs on, and mesa-vulkan-drivers the package
    # that gives one (the core's _runtime/device.py has the same allow-list entry)
    "test_gpu_device.py": "wgpu adapter backend type and driver install hint",
    # `edgeplug new-backend` offers templates over executorch's XNNPACK and Vulkan partitioners (the core's
    # _scaffold.py has the same allow-list entry); the generated package is a third party's backend
    "test_new_backend.py": "new-backend templates named after the executorch partitioners they start from",
    # coremltools is a dependency's import name, in the list of heavy imports a function-level import may defer
    "test_import_graph.py": "coremltools named as a heavy dependency",
}

#: file -> where its backend-specific part belongs (strict xfail until it is clean)
PENDING: dict[str, str] = {
    # issues 45, 49: ExecuTorch's backend suite and the strict IR check, run through the xnnpack and coreml plugins
    "test_executorch_suite_flow.py": "plugins/xnnpack/tests (ExecuTorch's suite through the xnnpack flow)",
    "test_ir_check.py": "plugins/xnnpack/tests and plugins/coreml/tests (what each delegates of the non-core ops)",
    "test_result_edge_and_etrecord.py": "plugins/xnnpack/tests (ETRecord and the Inspector on a real .pte)",
}


def _files() -> list[Path]:
    out = []
    for path in sorted(TESTS.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        if path.suffix in TEXT or path.name in ("METADATA", "entry_points.txt"):
            out.append(path)
    return out


def names_of_backends(text: str) -> list[str]:
    """``line: word`` for each first-party backend named in ``text``."""
    return [
        f"{i}: {m.group(0)}" for i, line in enumerate(text.splitlines(), 1) for m in FIRST_PARTY.finditer(line)
    ]


def _param(path: Path):
    rel = path.relative_to(TESTS).as_posix()
    marks = [pytest.mark.xfail(reason=PENDING[rel], strict=True)] if rel in PENDING else []
    return pytest.param(path, id=rel, marks=marks)


@pytest.mark.parametrize("path", [_param(p) for p in _files() if p.relative_to(TESTS).as_posix() not in ALLOWED])
def test_no_file_under_tests_names_a_first_party_backend(path):
    found = names_of_backends(path.read_text(errors="replace"))
    assert not found, (
        f"tests/{path.relative_to(TESTS).as_posix()} names a first-party backend at lines {', '.join(found[:12])}"
        f"{' ...' if len(found) > 12 else ''}: lower to a fixture backend (tests/fixtures/backends, the "
        "fixture_backends fixture) or move the test to plugins/<backend>/tests"
    )


def test_pending_and_allowed_entries_name_existing_files():
    missing = [rel for rel in (*PENDING, *ALLOWED) if not (TESTS / rel).is_file()]
    assert not missing, f"entries for files that are gone (remove them): {missing}"


def test_the_rule_sees_docstrings_comments_and_mixed_case():
    assert names_of_backends('"""Lowers on Vulkan."""') == ["1: Vulkan"]
    assert names_of_backends("x = 1\n# like XNNPACK does\n") == ["2: XNNPACK"]
    assert names_of_backends("target = 'et_vk.rms_norm'") == ["1: et_vk"]
    assert names_of_backends("backend = 'fixture-fused'  # edgeplug_fixture.rms_norm") == []
