"""The conformance suite every edgeplug backend must pass.

Run it with ``pytest --pyargs edgeplug.testing.conformance [--edgeplug-backend NAME]``
or import it into a test module (``from edgeplug.testing.conformance import *``);
see ``edgeplug.testing``. Each test is parametrised over the selected backends
through the ``edgeplug_backend_name`` fixture of ``edgeplug.testing.plugin``.

The tests (``__all__``, what ``import *`` brings into a plugin's test module):

``test_plugin_loaded_without_problems``
    No plugin of the backend's distribution was dropped while loading.
``test_distribution_declares_its_entry_point_and_needs_edgeplug``
    The distribution declares its ``edgeplug`` entry point and depends on edgeplug.
``test_distribution_declares_the_executorch_range_it_is_tested_with``
    The distribution requires ``executorch`` with the range of releases it is tested with.
``test_backend_spec``
    The spec has a description and a delegate id, builds an executorch ``Partitioner``, and its
    availability probe answers (with a reason and a hint when unavailable).
``test_records_validate_and_name_a_backend``
    Every record re-validates and names a registered backend.
``test_skip_table_holds_real_operator_overloads``
    Every op kept whole is an ``OpOverload`` that resolves in ``torch.ops``.
``test_fusion_policy``
    At most one policy per pattern; its target is a registered op taking the policy's arguments.
``test_norms_without_a_weight_fuse``
    The catalogue's norms with no weight (``rms_norm_cases``: no weight, the output also used,
    ``F.rms_norm(x, shape)``) each become one fused op that computes what eager computes, unless the
    policy keeps such norms decomposed (``weightless="keep"``).
``test_kernels_name_registered_ops``
    Every kernel's op is a registered operator once the backend's libraries load.
``test_filters_answer_within_their_contract``
    Each partitioner filter answers None, True, False or a Verdict, and changes nothing.
``test_llama_lowers``
    The Llama example lowers (a real ``.pte``, or a dry run where the delegate cannot serialize here).
``test_unavailable_backend_refuses_with_what_to_install``
    An unavailable backend's lowering refuses, naming the backend, why and what to install.
``test_kept_whole_ops_are_not_left_on_cpu``
    No op the backend keeps whole stays on the CPU.
``test_verification_matches_eager``
    A backend that can run its programs here matches eager.
``test_verification_fails_on_a_corrupted_weight``
    ``--verify`` catches a weight corrupted by ``edgeplug.testing.faults.CorruptWeight``.
``test_llm_custom_ops_are_delegated_or_named``
    ExecuTorch's LLM custom ops pass every stage: delegated, or left on the CPU with a reason.
``test_the_command_prints_only_edgeplugs_lines``
    ``edgeplug lower handwritten-llama-decoder --backend NAME`` (a dry run where it cannot serialize
    here), in a process of its own and without ``-v``: stderr holds edgeplug's lines only, none of an
    SDK's or executorch's.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from importlib.metadata import distribution

import pytest
import torch
from packaging.requirements import Requirement
from executorch.exir import EdgeCompileConfig, to_edge
from executorch.exir.backend.partitioner import Partitioner

from edgeplug import _executorch
import edgeplug
from edgeplug import Availability
from edgeplug._registry import lookup as plugins
from edgeplug._errors import BackendUnavailableError
from edgeplug._fusion.program import fusion_stage
from edgeplug._partition import FilterContext, op_name
from edgeplug._partition.phases import graph_fingerprint
from edgeplug._partition.verdict import NotAnAnswer, filter_answer
from edgeplug._fusion.target import PolicyTargetError, check_policy
from edgeplug._records import HOOK_RECORDS, FusionPolicy, resolve_op_name
from edgeplug._registry import ENTRY_POINT_GROUP
from edgeplug._verify.where import find_device_runtime
from edgeplug._verify.where import unrunnable as why_programs_cannot_run
from edgeplug.examples import list_examples, load_model
from edgeplug.testing import assert_no_traceback, error_line, files_under
from edgeplug.testing.faults import CorruptWeight
from edgeplug.testing.programs import CUSTOM_OPS, cached_attention
from edgeplug.testing.rms_norm_cases import ACCEPTED, Bundle

__all__ = [
    "test_plugin_loaded_without_problems",
    "test_distribution_declares_its_entry_point_and_needs_edgeplug",
    "test_distribution_declares_the_executorch_range_it_is_tested_with",
    "test_backend_spec",
    "test_records_validate_and_name_a_backend",
    "test_skip_table_holds_real_operator_overloads",
    "test_fusion_policy",
    "test_norms_without_a_weight_fuse",
    "test_kernels_name_registered_ops",
    "test_filters_answer_within_their_contract",
    "test_llama_lowers",
    "test_unavailable_backend_refuses_with_what_to_install",
    "test_kept_whole_ops_are_not_left_on_cpu",
    "test_verification_matches_eager",
    "test_verification_fails_on_a_corrupted_weight",
    "test_llm_custom_ops_are_delegated_or_named",
    "test_the_command_prints_only_edgeplugs_lines",
]

#: The example every backend must lower.
EXAMPLE = "handwritten-llama-decoder"
TOLERANCE = 1e-4


def _problems_of(backend) -> list[str]:
    return [
        p.message
        for p in plugins.problems()
        if p.plugin.distribution == backend.distribution and not backend.plugin.registered
    ]


def test_plugin_loaded_without_problems(edgeplug_backend):
    """No plugin of the backend's distribution was dropped while loading."""
    assert _problems_of(edgeplug_backend) == []


def test_distribution_declares_its_entry_point_and_needs_edgeplug(edgeplug_backend):
    """The backend's distribution declares its entry point in the ``edgeplug`` group and requires edgeplug."""
    info = edgeplug_backend.plugin
    if info.registered:
        pytest.skip(f"{edgeplug_backend.name!r} was registered in code, not installed")
    dist = distribution(info.distribution)
    eps = [e for e in dist.entry_points if e.group == ENTRY_POINT_GROUP]
    assert info.name in [e.name for e in eps], f"{info.distribution} declares no {ENTRY_POINT_GROUP!r} entry point {info.name!r}"
    requires = {re.split(r"[\s<>=!~;\[(]", r, maxsplit=1)[0].lower() for r in dist.requires or []}
    assert "edgeplug" in requires, f"{info.distribution} must depend on edgeplug (it has {sorted(requires)})"


def test_distribution_declares_the_executorch_range_it_is_tested_with(edgeplug_backend):
    """The distribution requires ``executorch`` with a version range (its tested releases, e.g. ``>=1.4,<1.6``):
    ``edgeplug plugins`` shows it, and a user on a release outside it gets one warning naming the plugin."""
    info = edgeplug_backend.plugin
    if info.registered:
        pytest.skip(f"{edgeplug_backend.name!r} was registered in code, not installed")
    reqs = [Requirement(r) for r in distribution(info.distribution).requires or []]
    ranges = [str(r.specifier) for r in reqs if r.name.lower() == "executorch"]
    assert ranges and all(ranges), (
        f"{info.distribution} declares no executorch range: add e.g. \"executorch{_executorch.TESTED_RANGE}\" (the "
        "releases you test with) to [project] dependencies"
    )


def test_backend_spec(edgeplug_backend):
    """The spec describes the backend, names its delegate, builds an executorch ``Partitioner``; the availability
    probe answers without raising, and an unavailable backend says why and what to do."""
    spec = edgeplug_backend.spec
    assert spec.description.strip(), "BackendSpec.description is empty"
    assert spec.backend_id.strip(), "BackendSpec.backend_id is empty"
    partitioner = edgeplug_backend.make_partitioner()
    assert isinstance(partitioner, Partitioner), (
        f"BackendSpec.partitioner() of {spec.backend!r} returned {type(partitioner).__name__}, "
        "not an executorch Partitioner"
    )
    availability = spec.availability()  # the probe itself must not raise
    assert isinstance(availability, Availability)
    if not availability.ok:
        assert availability.reason.strip(), "an unavailable backend must say why (Availability.reason)"
        assert availability.hint.strip(), "an unavailable backend must say what to do (Availability.hint)"


def test_records_validate_and_name_a_backend(edgeplug_backend):
    """Every record of the backend's distribution re-validates and names a registered backend."""
    known = set(edgeplug.backends())
    unclaimed = [u.message for u in plugins.unclaimed() if u.contribution.plugin == edgeplug_backend.plugin]
    assert not unclaimed, " | ".join(unclaimed)
    checked = 0
    for hook, record_type in HOOK_RECORDS.items():
        for info, record in plugins.manager().contributions(record_type):
            if info != edgeplug_backend.plugin:
                continue
            again = record_type.model_validate(dict(record))
            assert again == record, f"{hook} record {record!r} changes when validated again"
            assert record.backend in known, (
                f"{info.describe()} yields a {record_type.__name__} for backend {record.backend!r}, "
                f"which is unavailable (available: {', '.join(sorted(known))})"
            )
            checked += 1
    assert checked >= 1


def test_skip_table_holds_real_operator_overloads(edgeplug_backend):
    """Every op the backend keeps whole is an ``OpOverload`` that ``torch.ops`` resolves to the same object."""
    for op in edgeplug_backend.keep_whole:
        assert isinstance(op, torch._ops.OpOverload), f"{op!r} is not an OpOverload"
        ns, name = op._schema.name.split("::")
        packet = getattr(getattr(torch.ops, ns), name)
        assert getattr(packet, op._overloadname) is op, f"{op} does not resolve in torch.ops"


def test_fusion_policy(edgeplug_backend):
    """At most one policy per pattern; the fused target is a registered operator taking the policy's arguments."""
    policies = edgeplug_backend.fusion_policies
    if not policies:
        pytest.skip(f"backend {edgeplug_backend.name!r} declares no fusion policy: nothing is fused for it")
    patterns = [p.pattern for p in policies]
    assert len(patterns) == len(set(patterns)), f"two fusion policies for one pattern: {patterns}"
    edgeplug_backend.make_partitioner()  # importing the partitioner may register custom ops too
    for policy in policies:
        assert FusionPolicy.model_validate(dict(policy)) == policy
        assert policy.weight_sources, "a fusion policy must accept at least one weight source"
        try:
            check_policy(policy)  # runs the policy's load_target
        except PolicyTargetError as exc:
            raise AssertionError(f"fusion policy {policy.emits} of {edgeplug_backend.name!r}: {exc}") from None


#: the catalogue's norms with no weight of their own (``edgeplug.testing.rms_norm_cases``)
WEIGHTLESS = ("no_weight", "norm_output_also_used", "f_rms_norm_no_weight")


def test_norms_without_a_weight_fuse(edgeplug_backend):
    """Each norm with no weight becomes one fused op (its record not a rejection) matching eager."""
    policy = edgeplug_backend.fusion_policy("rms_norm")
    if policy is None:
        pytest.skip(f"backend {edgeplug_backend.name!r} declares no rms_norm fusion policy")
    if policy.weightless == "keep":
        pytest.skip(f"backend {edgeplug_backend.name!r} keeps norms without a weight decomposed (weightless='keep')")
    edgeplug_backend.make_partitioner()  # may register the fused op
    bundle = Bundle([c for c in ACCEPTED if c.name in WEIGHTLESS]).eval()
    inputs = bundle.inputs()
    if fusion_stage(policy) == "export":
        with torch.no_grad():
            ep = torch.export.export(bundle, inputs)
    else:
        ep = bundle.edge_program()
    fused, records = edgeplug.fuse(ep, edgeplug_backend)
    assert len(records) == len(bundle.cases), records
    rejected = [r for r in records if r.outcome == "rejected"]
    if rejected and all("does not keep" in r.reason for r in rejected):  # every fusion of its policy is vetoed alike
        pytest.skip(f"backend {edgeplug_backend.name!r} does not keep {policy.target} whole, so no norm fuses: {rejected[0].reason}")
    assert not rejected, f"{edgeplug_backend.name}: norms without a weight not fused: {rejected}"
    ns, name = policy.target.split(".")[:2]
    fused_ops = [n for n in fused.graph_module.graph.nodes if n.op == "call_function" and f"{ns}.{name}" in str(n.target)]
    assert len(fused_ops) == len(bundle.cases), [str(n.target) for n in fused_ops]
    with torch.no_grad():
        want, got = bundle(*inputs), fused.module()(*inputs)
    for case, w, g in zip(bundle.cases, want, got):
        diff = (w - g).abs().max().item()
        assert diff <= case.tolerance(), f"{edgeplug_backend.name} {case.name}: max |diff| {diff}"


def test_kernels_name_registered_ops(edgeplug_backend):
    """Every kernel's op (namespace.name.overload) is a registered operator once the backend's libraries load."""
    kernels = edgeplug_backend.kernels
    if not kernels:
        pytest.skip(f"backend {edgeplug_backend.name!r} registers no kernels")
    edgeplug_backend.make_partitioner()  # importing the partitioner may register custom ops
    for policy in edgeplug_backend.fusion_policies:
        if getattr(policy, "load_target", None) is not None:
            policy.load_target()
    registered = set(torch._C._dispatch_get_all_op_names())
    for kernel in kernels:
        resolve_op_name(kernel.op)  # the format, and a close match where the namespace is known
        ns, name, overload = kernel.op.split(".")
        qualified = f"{ns}::{name}" + ("" if overload == "default" else f".{overload}")
        assert qualified in registered, (
            f"kernel op {kernel.op!r} of backend {edgeplug_backend.name!r} is not a registered operator, "
            "so no node ever calls it; check the name against str(node.target) of the delegate's nodes"
        )


_EXAMPLE_PROGRAMS: dict = {}


def _example_programs(name: str) -> tuple:
    """(aten program, edge program) of one built-in example, exported once per session (callers copy)."""
    if name not in _EXAMPLE_PROGRAMS:
        loaded = load_model(name)
        model, args = loaded[0], loaded[1]
        kwargs = loaded[2] if len(loaded) > 2 and isinstance(loaded[2], dict) else None
        aten = torch.export.export(model, tuple(args), kwargs)
        edge = to_edge(torch.export.export(model, tuple(args), kwargs), compile_config=EdgeCompileConfig(_check_ir_validity=False))
        _EXAMPLE_PROGRAMS[name] = (aten, edge.exported_program())
    return _EXAMPLE_PROGRAMS[name]


def test_filters_answer_within_their_contract(edgeplug_backend):
    """Each filter, on every node of every example (aten and edge), answers None/True/False/a Verdict and changes nothing."""
    filters = edgeplug_backend.filters
    if not filters:
        pytest.skip(f"backend {edgeplug_backend.name!r} declares no partitioner filter")
    problems = []
    for example in list_examples():
        for stage, program in zip(("before_decomposition", "partition"), _example_programs(example)):
            ep = copy.deepcopy(program)
            ctx = FilterContext(stage=stage, ep=ep, backend=edgeplug_backend.name)
            for f in filters:
                before = graph_fingerprint(ep.graph_module)
                for node in list(ep.graph.nodes):
                    if node.op != "call_function":
                        continue
                    where = f"filter {f.name!r} on {example}'s node {node.name!r} ({node.target}) at stage {stage!r}"
                    try:
                        filter_answer(f.fn(node, ctx), f.name)
                    except NotAnAnswer as exc:
                        problems.append(f"{where}: {exc}")
                    except Exception as exc:
                        problems.append(f"{where} raised {type(exc).__name__}: {exc}")
                if graph_fingerprint(ep.graph_module) != before:
                    problems.append(f"filter {f.name!r} changed {example}'s {stage} program; a filter only reads")
                if len(problems) > 5:
                    break
    assert not problems, "\n".join(problems[:6])


def _lowered(edgeplug_lowering, backend):
    return edgeplug_lowering(EXAMPLE, backend.name)


def test_llama_lowers(edgeplug_backend, edgeplug_lowering):
    """The example lowers: with a real .pte naming the delegate, or as a dry run where it cannot serialize."""
    result = _lowered(edgeplug_lowering, edgeplug_backend)
    report = result.report
    ours = [p for p in report.partitions if p.backend_id == edgeplug_backend.spec.backend_id]
    assert ours, f"no partition for {edgeplug_backend.spec.backend_id}: {report.to_table()}"
    assert report.delegated_nodes > 0
    if edgeplug_backend.availability().ok:
        # a backend whose preprocess stands in for the compiler (a vendor's saver mode) says so, and is no dry run's
        assert report.dry_run == (report.stand_in is not None)
        assert report.stand_in is None or report.stand_in.kind == "backend"
        ids = _executorch.pte_delegate_ids(result.buffer)
        assert edgeplug_backend.spec.backend_id in ids
    else:
        assert report.dry_run and result.program is None


def test_unavailable_backend_refuses_with_what_to_install(edgeplug_backend):
    """Where the backend cannot serialize here, ``edgeplug.lower`` refuses with ``BackendUnavailableError`` naming
    the backend, the reason, the hint and ``--dry-run``."""
    availability = edgeplug_backend.availability()
    if availability.ok:
        pytest.skip(f"{edgeplug_backend.name!r} can serialize here")
    model, inputs, _, _ = load_model(EXAMPLE)
    with pytest.raises(BackendUnavailableError) as err:
        edgeplug.lower(model, inputs, edgeplug_backend)
    message = str(err.value)
    assert edgeplug_backend.name in message
    assert availability.reason in message and availability.hint in message
    assert "--dry-run" in message


def test_kept_whole_ops_are_not_left_on_cpu(edgeplug_backend, edgeplug_lowering):
    """One predicate decides keep-whole and delegate: no kept-whole op stays on the CPU."""
    report = _lowered(edgeplug_lowering, edgeplug_backend).report
    kept = {op_name(op) for op in edgeplug_backend.keep_whole}
    stranded = {op: n for op, n in report.cpu_ops.items() if op in kept}
    assert not stranded, (
        f"{edgeplug_backend.name}: ops kept whole through to_edge but left on the CPU: {stranded}"
    )


def test_verification_matches_eager(edgeplug_backend, edgeplug_lowering):
    """A backend that says it can run its programs here (BackendSpec.verify) matches eager."""
    unrunnable = why_programs_cannot_run(edgeplug_backend)
    if unrunnable:
        pytest.skip(f"{edgeplug_backend.name!r} cannot run its programs on this host: {unrunnable}")
    if not edgeplug_backend.availability().ok:
        pytest.skip(f"{edgeplug_backend.name!r} cannot serialize here, so there is nothing to run")

    report = edgeplug_lowering(EXAMPLE, edgeplug_backend.name, verify=True).report
    runtime, _ = find_device_runtime(edgeplug_backend)  # the backend's own runtime runs the .pte where it is built
    expected = "pte" if runtime is not None else edgeplug_backend.spec.verify_method
    assert report.verification.method == expected
    if runtime is not None:
        assert report.verification.adapter.startswith(runtime.name), report.verification.adapter
    assert report.verification.max_abs_diff < TOLERANCE, report.to_table()


def test_verification_fails_on_a_corrupted_weight(edgeplug_backend, edgeplug_cli, edgeplug_register, tmp_path):
    """A verification that cannot fail is a defect: ``edgeplug lower mlp --verify`` with a pass that scales a
    weight by 1.01 (``edgeplug.testing.faults.CorruptWeight``) exits 3 with one error line naming the
    difference, writes the report (strict JSON, saying why) and no .pte, and shows no traceback."""
    unrunnable = why_programs_cannot_run(edgeplug_backend)
    if unrunnable:
        pytest.skip(f"{edgeplug_backend.name!r} cannot run its programs on this host: {unrunnable}")
    if not edgeplug_backend.availability().ok:
        pytest.skip(f"{edgeplug_backend.name!r} cannot serialize here, so there is nothing to run")
    edgeplug_register(CorruptWeight((edgeplug_backend.name,), "scale"), name="corrupter")
    out, rep = tmp_path / "m.pte", tmp_path / "m.json"
    code, _, stderr = edgeplug_cli("lower", "mlp", "-b", edgeplug_backend.name, "--verify", "-o", out, "--report", rep, "-q")
    assert code == 3, stderr
    first = error_line(stderr)
    assert first.startswith("edgeplug: error: verification failed: output 0: ")
    assert "max |difference|" in first and f"> tolerance {TOLERANCE:.3e}" in first
    assert first.endswith("no .pte was written")
    assert not out.exists() and files_under(tmp_path) == ["m.json"]
    data = json.loads(rep.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c} in the report"))
    assert data["summary"]["verified"] is False and data["output_path"] is None
    assert data["verification"]["outputs"][0]["problems"]
    assert_no_traceback(stderr)


def test_llm_custom_ops_are_delegated_or_named(edgeplug_backend):
    """ExecuTorch's LLM custom ops (``llama::update_cache``, ``llama::custom_sdpa``) in a program with a
    dynamic sequence length pass every stage: each is delegated or left on the CPU with a reason, and
    the caller's program can be lowered again afterwards."""
    ep, args = cached_attention()
    code = ep.graph_module.code
    dry_run = not edgeplug_backend.availability().ok
    report = edgeplug.lower(ep, args, edgeplug_backend, dry_run=dry_run).report
    on_cpu = {c.op: c.reason for c in report.cpu_nodes}
    delegated = set(report.delegated_ops)
    for op in CUSTOM_OPS:
        assert op in on_cpu or op in delegated, (
            f"{edgeplug_backend.name}: {op} is neither delegated nor on the CPU: {report.to_table()}"
        )
        assert op not in on_cpu or on_cpu[op].strip(), f"{edgeplug_backend.name}: {op} is on the CPU with no reason"
    assert ep.graph_module.code == code, "the lowering changed the caller's program"
    again = edgeplug.lower(ep, args, edgeplug_backend, dry_run=True).report
    assert again.cpu_ops == report.cpu_ops, "a second lowering of the same program partitioned it differently"


#: what edgeplug itself writes to stderr: a progress line (``   2.5s [NAME] export ...``), or ``edgeplug: ...``
EDGEPLUG_LINE = r"( *\d+\.\ds .*|edgeplug: .*)"


def foreign_lines(stderr: str) -> list[str]:
    """The lines of ``stderr`` that edgeplug did not write (a library's log, a Python logging record, a warning)."""
    return [line for line in stderr.splitlines() if line.strip() and not re.fullmatch(EDGEPLUG_LINE, line)]


def test_the_command_prints_only_edgeplugs_lines(edgeplug_backend, tmp_path):
    """Quiet by default: ``edgeplug lower handwritten-llama-decoder --backend NAME`` without ``-v``, in a
    process of its own (what native libraries print to the process's stderr included), writes only
    edgeplug's lines to stderr."""
    if edgeplug_backend.plugin.registered and not edgeplug_backend.plugin.named_in_env:
        pytest.skip(f"{edgeplug_backend.name!r} was registered in this process only: another process has no such backend")
    argv = [sys.executable, "-m", "edgeplug._cli", "lower", EXAMPLE, "--backend", edgeplug_backend.name,
            "-o", str(tmp_path / "out.pte")]
    if not edgeplug_backend.availability().ok:
        argv.append("--dry-run")
    env = {k: v for k, v in os.environ.items() if k != "EDGEPLUG_DEBUG"}
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"[{edgeplug_backend.name}] export ..." in p.stderr  # the progress lines are there, and read as edgeplug's
    assert foreign_lines(p.stderr) == [], p.stderr[-3000:]


#: torch's, executorch's and their dependencies' deprecation notices, which every lowering prints and a
#: plugin's author can do nothing about: the conformance tests ignore them (a plugin's own still show)
_THEIRS = r"(torch|executorch|torchao|coremltools|copyreg)(\..*)?"
for _name in __all__:
    for _category in ("DeprecationWarning", "FutureWarning"):
        globals()[_name] = pytest.mark.filterwarnings(f"ignore::{_category}:{_THEIRS}")(globals()[_name])
del _name, _category

