"""What a backend author reads points at ``edgeplug.plugin``, and what several plugins share is said once there.

- Every hook's docstring, every record's docstring and the author module's own docstring name public
  paths only (``edgeplug.plugin...``), never a private module (``edgeplug._records``, ``edgeplug._partition``):
  an author who follows one would import what may change in any release.
- ``edgeplug.plugin.aten_rms_norm_policy`` is the policy of a backend whose partitioner delegates
  ``aten.rms_norm``, and no plugin in this repository writes that policy out field by field again.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import edgeplug.plugin as author

ROOT = Path(__file__).resolve().parents[1]
PRIVATE = re.compile(r"edgeplug\._\w+")


def _author_texts() -> dict[str, str]:
    texts = {"edgeplug.plugin": author.__doc__ or ""}
    for name in dir(author.hookspecs):
        if name.startswith("edgeplug_"):
            texts[f"hookspecs.{name}"] = inspect.getdoc(getattr(author.hookspecs, name)) or ""
    texts["hookspecs"] = author.hookspecs.__doc__ or ""
    for name in ("BackendSpec", "KeepWhole", "PartitionerFilter", "FusionPolicy", "Kernel", "PassSpec",
                 "QuantScheme", "aten_rms_norm_policy"):
        texts[name] = inspect.getdoc(getattr(author, name)) or ""
    # the field comments (#:) of the records are what an author reads beside each field
    records = inspect.getsource(inspect.getmodule(author.BackendSpec))
    texts["record field comments"] = "\n".join(line for line in records.splitlines() if line.strip().startswith("#:"))
    return texts


def test_hook_and_record_docs_name_public_paths_only():
    private = {where: sorted(set(PRIVATE.findall(text))) for where, text in _author_texts().items() if PRIVATE.search(text)}
    assert private == {}, f"author-facing text naming private modules (say edgeplug.plugin.X instead): {private}"


def test_the_hook_contracts_are_reachable_from_the_author_module():
    assert "edgeplug_backends" in dir(author.hookspecs)
    assert "hookspecs" in author.__all__
    assert author.hookspecs.edgeplug_partitioner_filters.__doc__.count("edgeplug.plugin.refuse") == 1


def test_the_private_path_check_can_fail():
    assert PRIVATE.search("an ``edgeplug._partition.FilterContext``")
    assert not PRIVATE.search("an ``edgeplug.plugin.FilterContext``")


def test_aten_rms_norm_policy_is_the_shared_policy_and_takes_changes():
    policy = author.aten_rms_norm_policy("mynpu")
    assert isinstance(policy, author.FusionPolicy)
    assert (policy.backend, policy.pattern, policy.target) == ("mynpu", "rms_norm", "aten.rms_norm")
    assert policy.emits == "aten.rms_norm(input, normalized_shape, weight, eps)"
    assert policy.weight_sources == frozenset({"leaf"})
    assert policy.dequantized_weights == "keep"
    assert (policy.fold_computed_constants, policy.unit_weight_fallback, policy.fp32_accumulation) == (True, True, False)
    assert policy.weightless == "fuse"
    ones = author.aten_rms_norm_policy("mynpu", weightless="ones")
    assert ones.weightless == "ones" and ones.target == "aten.rms_norm"
    with pytest.raises(ValueError, match="weightless"):  # a change is validated like any record field
        author.aten_rms_norm_policy("mynpu", weightless="sometimes")


def _policies_written_out(path: Path) -> list[int]:
    """Lines of ``path`` that build ``FusionPolicy(..., target="aten.rms_norm", ...)`` field by field."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "FusionPolicy":
            for kw in node.keywords:
                if kw.arg == "target" and isinstance(kw.value, ast.Constant) and kw.value.value == "aten.rms_norm":
                    out.append(node.lineno)
    return out


def test_no_plugin_writes_the_aten_rms_norm_policy_out_again():
    hooks = sorted((ROOT / "plugins").glob("*/edgeplug_*/*.py"))
    assert hooks, "no plugin sources found"
    again = {str(p.relative_to(ROOT)): lines for p in hooks if (lines := _policies_written_out(p))}
    assert again == {}, f"use edgeplug.plugin.aten_rms_norm_policy(backend) instead: {again}"
    users = [p for p in hooks if "aten_rms_norm_policy(" in p.read_text()]
    assert len(users) == 3, [str(p.relative_to(ROOT)) for p in users]


def test_the_written_out_check_can_fail(tmp_path):
    planted = tmp_path / "hooks.py"
    planted.write_text('from edgeplug.plugin import FusionPolicy\nFusionPolicy(backend="b", target="aten.rms_norm")\n')
    assert _policies_written_out(planted) == [2]
