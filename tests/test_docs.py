"""The documentation stays true: every hook, variable, command and fixture is documented."""

from __future__ import annotations

import copy
import inspect
import re
import shlex
from pathlib import Path

import pytest

from edgeplug import _hookspecs as hookspecs
from edgeplug._records import HOOK_RECORDS

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def _hooks() -> list[str]:
    """Every hook hookspecs.py declares."""
    return sorted(n for n, f in vars(hookspecs).items() if n.startswith("edgeplug_") and inspect.isfunction(f))


@pytest.fixture(scope="module")
def readme() -> str:
    assert README.is_file(), "README.md is missing at the repository root"
    return README.read_text()


def test_hookspecs_and_the_record_table_agree():
    assert _hooks() == sorted(HOOK_RECORDS)


@pytest.mark.parametrize("hook", _hooks())
def test_every_hook_is_documented(hook, readme):
    spec = getattr(hookspecs, hook)
    assert inspect.getdoc(spec), f"{hook} has no docstring in hookspecs.py"
    assert f"``{hook}``" in hookspecs.__doc__, f"{hook} is missing from hookspecs.py's overview"
    row = re.search(rf"^\| `{hook}` \| `(\w+)` \|", readme, re.M)
    assert row, f"{hook} has no row in README.md's hook table"
    assert row.group(1) == HOOK_RECORDS[hook].__name__, f"README.md says {hook} yields {row.group(1)}"


def test_plugin_variables_and_registration_are_documented(readme):
    from edgeplug import _registry as plugins

    for name in (plugins.ENV_DISABLE, plugins.ENV_ALLOW, "edgeplug.register_plugin"):
        assert name in readme, f"{name} is not documented in README.md"
    for name in (plugins.ENV_DISABLE, plugins.ENV_ALLOW, "``register``"):
        assert name in plugins.__doc__


def _readme_commands(readme: str) -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.S)
    lines = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("edgeplug ")]


def test_every_cli_command_is_documented(readme):
    from edgeplug._cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    documented = {shlex.split(c)[1] for c in _readme_commands(readme)}
    assert set(sub.choices) <= documented
    for option in ("-o", "--report", "--verify", "--dry-run", "--backend"):
        assert option in readme


def test_readme_commands_parse(readme):
    """A documented command line the CLI would reject is a documentation bug."""
    from edgeplug._cli import build_parser

    commands = _readme_commands(readme)
    assert len(commands) >= 5
    for command in commands:
        build_parser().parse_args(shlex.split(command)[1:])


def test_readme_python_api_exists(readme):
    import edgeplug

    used = set(re.findall(r"edgeplug\.(\w+)\(", readme))
    assert {"backends", "lower", "transform", "fuse"} <= used
    for name in used - {"plugins"}:
        assert name in edgeplug.__all__, f"README.md calls edgeplug.{name}, which is not public API"


def test_testing_docs_name_every_fixture_and_the_command():
    import edgeplug.testing as testing
    import edgeplug.testing.plugin as plugin

    fixtures = sorted(n for n in vars(plugin) if n.startswith("edgeplug_"))
    assert fixtures == ["edgeplug_backend", "edgeplug_cli", "edgeplug_lowering", "edgeplug_no_network", "edgeplug_plain_env", "edgeplug_register", "edgeplug_site"]
    for name in fixtures:
        assert f"``{name}``" in testing.__doc__, f"fixture {name} is not documented in edgeplug.testing"
    assert "pytest --pyargs edgeplug.testing.conformance" in testing.__doc__
    assert plugin.OPTION in testing.__doc__


def test_no_path_of_a_build_machine_in_the_sources():
    roots = [REPO / "core", REPO / "plugins", REPO / "tests", REPO / ".ci"]
    files = [REPO / "README.md", REPO / "Makefile", REPO / "pyproject.toml"]
    files += [p for r in roots if r.is_dir() for p in r.rglob("*") if p.is_file() and p.suffix in {".py", ".md", ".toml", ".txt", ".sh", ""}]
    forbidden = re.compile("/" + "work/|/" + "root/|/" + "home/[a-z]")
    offenders = [str(p.relative_to(REPO)) for p in files if "__pycache__" not in p.parts and forbidden.search(p.read_text(errors="ignore"))]
    assert offenders == []


# -- the author's guide -----------------------------------------------------------------

GUIDE = REPO / "docs" / "writing-a-backend.md"


@pytest.fixture(scope="module")
def guide() -> str:
    assert GUIDE.is_file(), "docs/writing-a-backend.md is missing"
    return GUIDE.read_text()


def test_readme_links_the_guide(readme):
    assert "(docs/writing-a-backend.md)" in readme


@pytest.mark.parametrize("hook", _hooks())
def test_the_guide_has_a_section_and_an_example_per_hook(hook, guide):
    section = re.search(rf"^### `{hook}`\n(.*?)(?=^### |^## )", guide, re.S | re.M)
    assert section, f"docs/writing-a-backend.md has no section for {hook}"
    examples = re.findall(r"```python\n(.*?)```", section.group(1), re.S)
    assert any(f"def {hook}(" in e and "@hookimpl" in e for e in examples), f"no example implements {hook}"
    assert f"`{HOOK_RECORDS[hook].__name__}" in section.group(1), f"the {hook} section does not name its record"


def test_the_guides_examples_define_working_hooks(guide):
    """Every python example compiles; the hook examples yield records that validate."""
    import types

    import edgeplug

    blocks = re.findall(r"```python\n(.*?)```", guide, re.S)
    assert len(blocks) >= 7
    hooks = [b for b in blocks if "@hookimpl" in b]
    for block in blocks:
        compile(block, str(GUIDE), "exec")
    # the hook examples read as one hooks module, in order
    module = types.ModuleType("guide_example")
    exec(compile("\n\n".join(hooks), str(GUIDE), "exec"), module.__dict__)
    yielded = []
    for name, fn in vars(module).items():
        if name.startswith("edgeplug_"):
            yielded += list(fn() or ())
    kinds = {type(r).__name__ for r in yielded}
    assert {"BackendSpec", "KeepWhole", "PartitionerFilter", "FusionPolicy", "Kernel", "PassSpec", "QuantScheme"} <= kinds
    assert all(r.backend == "mynpu" for r in yielded)
    assert isinstance(yielded[0], edgeplug.BackendSpec)


def test_the_guide_covers_what_authors_asked_for(guide):
    for text in (
        "edgeplug new-backend", "exir_ops.edge.aten.div.Tensor", "torch.ops.aten.div.Tensor",
        "aten.rms_norm", "`load_target`", "namespace.name.overload", "## Choosing `backend_id`",
        "pytest --pyargs edgeplug.testing.conformance --edgeplug-backend", "edgeplug[testing]",
        "edgeplug.plugin.refuse", "RmsNormKernelSuite",
    ):
        assert text in guide, f"docs/writing-a-backend.md does not mention {text}"


def test_the_guides_commands_parse(guide):
    from edgeplug._cli import build_parser

    lines = [l.split("#")[0].strip() for b in re.findall(r"```sh\n(.*?)```", guide, re.S) for l in b.splitlines()]
    commands = [l for l in lines if l.startswith("edgeplug ")]
    assert {shlex.split(c)[1] for c in commands} >= {"new-backend", "plugins", "lower", "backends"}
    for command in commands:
        build_parser().parse_args(shlex.split(command)[1:])


def test_the_guides_own_rewrite_example_runs_as_written():
    """The guide's relu_as_clamp block, executed as it stands, rewrites an edge program and returns its records."""
    import torch
    from executorch.exir import to_edge

    guide = (REPO / "docs" / "writing-a-backend.md").read_text()
    [block] = [b for b in re.findall(r"```python\n(.*?)```", guide, re.S) if "def relu_as_clamp" in b]
    namespace: dict = {}
    exec(compile(block, "writing-a-backend.md", "exec"), namespace)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    x = torch.randn(2, 4)
    ep = to_edge(torch.export.export(model, (x,))).exported_program()
    before = copy.deepcopy(ep).module()(x)
    done = namespace["relu_as_clamp"](ep)
    assert done.program is ep
    log = done.records
    ep.graph_module.recompile()
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert any("clamp" in t for t in targets) and not any("relu" in t for t in targets)
    assert [(r.transform, r.outcome, r.removed, r.added) for r in log] == [("relu_as_clamp", "applied", 1, 1)]
    assert torch.equal(ep.module()(x), before)  # the program computes what it computed, bit for bit


def _shown(value):
    """A record field's default as the guide writes it (`"none"`, `True`, `("input", ...)`, `{"leaf"}`)."""
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return "(" + ", ".join(_shown(v) for v in value) + ")"
    if isinstance(value, frozenset):
        return "{" + ", ".join(_shown(v) for v in sorted(value)) + "}"
    if callable(value):
        return None  # described in words ("always available")
    return str(value)


@pytest.mark.parametrize("hook", ["edgeplug_backends", "edgeplug_fusion_policies"])
def test_every_field_of_the_records_authors_fill_has_a_row_with_its_default(hook, guide):
    """A field added to BackendSpec or FusionPolicy without a row (and its default) in the guide fails here."""
    record = HOOK_RECORDS[hook]
    section = re.search(rf"^### `{hook}`\n(.*?)(?=^### |^## )", guide, re.S | re.M).group(1)
    assert "| field | default | meaning |" in section, f"the {hook} section's field table has no default column"
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \| .+ \|$", section, re.M))
    missing = sorted(set(record.model_fields) - set(rows))
    assert not missing, f"docs/writing-a-backend.md documents no {record.__name__} field {missing}"
    stale = sorted(set(rows) - set(record.model_fields))
    assert not stale, f"docs/writing-a-backend.md documents {record.__name__} fields that do not exist: {stale}"
    for name, field in record.model_fields.items():
        cell = rows[name].strip()
        if field.is_required():
            assert cell == "required", f"{record.__name__}.{name} is required; the guide says {cell!r}"
            continue
        shown = _shown(field.default)
        assert cell != "required", f"{record.__name__}.{name} has a default; the guide calls it required"
        if shown is not None:
            assert f"`{shown}`" in cell, f"{record.__name__}.{name} defaults to {shown}; the guide says {cell!r}"


def test_the_guide_says_what_each_answer_means(guide):
    section = re.search(r"^## What each answer means\n(.*?)(?=^## )", guide, re.S | re.M)
    assert section, "docs/writing-a-backend.md has no 'What each answer means' section"
    text = section.group(1)
    for words in ("a `dict`", "a `str`", "`refuse` not called", "`0`", '`"yes"`', "changing the program", "no `.pte`"):
        assert words in text, f"the answers table does not say what happens to {words}"
    from edgeplug._registry import ENV_HOOK_SECONDS

    assert ENV_HOOK_SECONDS in guide
