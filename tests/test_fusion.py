"""edgeplug.fuse under each kind of policy, on real edge programs.

The policies are the fixture backends' (tests/fixtures/backends): ``aten.rms_norm``
kept whole (fixture-keep), a backend's own op accumulating in fp32
(fixture-fused) and the same op without fp32 accumulation (fixture-fused-narrow).

Every accepted spelling becomes exactly one fused op whose eps, weight and
input are checked, and the fused program computes what eager computes; every
near-miss is left alone and reported with its reason.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

import edgeplug
from edgeplug import FusionPolicy
from edgeplug._errors import EdgeplugError
from edgeplug._graph.constants import constant_value
from edgeplug._fusion.nodes import is_op
from edgeplug.testing.rms_norm_cases import ACCEPTED, D, REJECTED, ROUNDED, UNRELATED, WHOLE, Bundle

KEEP, FUSED, NARROW, TABLE = "fixture-keep", "fixture-fused", "fixture-fused-narrow", "fixture-table"
BACKENDS = [KEEP, FUSED, NARROW]
OWN_OP = "edgeplug_fixture.rms_norm"
TARGET = {"aten.rms_norm": "aten::rms_norm", OWN_OP: "edgeplug_fixture::rms_norm"}


@pytest.fixture(autouse=True)
def _backends(fixture_backends):
    """Every test here fuses for the fixture backends."""


@pytest.fixture(scope="module")
def programs():
    """One edge program per bundle (an export costs about a second) and a cache of fusions."""
    bundles = {"decomposed": Bundle(ACCEPTED), "whole": Bundle(WHOLE), "refused": Bundle(REJECTED + UNRELATED)}
    eps = {k: b.edge_program() for k, b in bundles.items()}
    fused: dict = {}

    def get(kind: str, backend: str):
        if (kind, backend) not in fused:
            fused[kind, backend] = edgeplug.fuse(eps[kind], backend)
        return bundles[kind], eps[kind], *fused[kind, backend]

    return get


def _records_of(bundle, ep, records, case):
    """The records whose anchor (a node of the input program) belongs to ``case``."""
    owner = {n.name: c for n, c in bundle.case_of(ep).items()}
    return [r for r in records if owner.get(r.anchor) is case]


def _fused_nodes(bundle, fused_ep, case, target):
    owner = bundle.case_of(fused_ep)
    return [n for n in fused_ep.graph_module.graph.nodes if owner.get(n) is case and is_op(n, TARGET[target])]


def _expected_outcome(case, policy) -> str:
    if case.scale:
        return "fused_unit_weight"
    if case.weight is None:
        return "fused"
    if case.weight == "runtime" or case in ROUNDED:
        return "fused_unit_weight"
    if case.weight == "computed" or case.name == "leading_ones_weight":
        return "folded_weight"
    if case.name == "fp16_upcast" and not policy.fp32_accumulation:
        return "folded_weight"  # the fp16 weight becomes an fp32 constant for the fp32 norm
    return "fused"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [c for c in ACCEPTED + WHOLE if c.accept], ids=lambda c: c.name)
def test_accepted_case_becomes_one_fused_op(programs, backend, case):
    policy = edgeplug.get_backend(backend).fusion_policy("rms_norm")
    bundle, ep, fused_ep, records = programs("whole" if case.whole else "decomposed", backend)
    (record,) = _records_of(bundle, ep, records, case)
    assert record.outcome == _expected_outcome(case, policy), record
    nodes = _fused_nodes(bundle, fused_ep, case, policy.target)
    assert len(nodes) == 1, f"{case.name}: {len(nodes)} fused ops"
    (node,) = nodes
    if policy.target == "aten.rms_norm":
        x, normalized_shape, weight, eps = node.args
        assert list(normalized_shape) == [D]
    else:
        x, weight, eps = node.args
    assert isinstance(eps, float) and math.isclose(eps, case.eps, rel_tol=1e-6), (eps, case.eps)
    assert record.eps == eps

    # fp32 upcasts stay outside the fused op unless the kernel accumulates in fp32
    upcast = case.name in ("fp16_upcast", "fp16_gemma_upcast", "bf16_gemma_after_cast")
    # the cast back follows the norm (and the backend delegates the op in fp16; in bf16 none does)
    absorbed = policy.fp32_accumulation and case.name == "fp16_upcast"
    expected_dtype = torch.float32 if upcast and not absorbed else case.dtype
    assert x.meta["val"].dtype == expected_dtype
    assert node.meta["val"].dtype == expected_dtype

    module = bundle.parts[bundle.cases.index(case)]
    if record.outcome == "fused_unit_weight" or case.weight is None:
        if policy.target == "aten.rms_norm":
            assert weight is None
        else:
            assert torch.equal(constant_value(fused_ep, weight), torch.ones(D, dtype=expected_dtype))
    else:
        assert weight.op == "placeholder", "the fused weight must be a constant of the program"
        value = constant_value(fused_ep, weight)
        expected = case.weight_value(module).detach().reshape(D).to(expected_dtype)
        assert value.shape == (D,) and value.dtype == expected_dtype
        torch.testing.assert_close(value, expected, rtol=0, atol=0)
        assert record.weight == weight.name
    if record.outcome == "fused_unit_weight":
        # the multiply by the runtime (or rounded-over) weight stays, downstream of the fused norm
        downstream, frontier = set(), [node]
        for _ in range(4):
            frontier = [u for n in frontier for u in n.users]
            downstream.update(frontier)
        assert any(is_op(u, "aten::mul.Tensor") for u in downstream), f"{case.name}: the weight multiply is gone"
        expected = {"runtime": "runtime"}.get(case.weight, "rounds the norm's output")
        if case.scale:
            expected = "the norm is fused alone and the multiply stays"
        assert expected in record.reason


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["decomposed", "whole", "refused"])
def test_fused_program_computes_what_eager_computes(programs, backend, kind):
    bundle, ep, fused_ep, _ = programs(kind, backend)
    inputs = bundle.inputs()
    with torch.no_grad():
        eager = bundle(*inputs)
        unfused = ep.module()(*inputs)
        got = fused_ep.module()(*inputs)
    for case, e, u, g in zip(bundle.cases, eager, unfused, got):
        assert g.dtype == e.dtype and g.shape == e.shape, case.name
        if kind == "refused":  # nothing was fused: bit for bit what the input program computes
            torch.testing.assert_close(g, u, rtol=0, atol=0, equal_nan=True, msg=case.name)
        else:
            tol = case.tolerance()
            torch.testing.assert_close(g, e, rtol=tol, atol=tol, msg=case.name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["decomposed", "whole"])
def test_fusion_leaves_no_dead_nodes_and_no_unused_constants(programs, backend, kind):
    """Folding and rewriting remove what they replaced: no op without users, no constant nothing reads."""
    _, _, fused_ep, _ = programs(kind, backend)
    graph = fused_ep.graph_module.graph
    dead = [n.name for n in graph.nodes if n.op == "call_function" and not n.users]
    assert dead == [], f"ops nothing reads: {dead}"
    specs = {s.arg.name: s for s in fused_ep.graph_signature.input_specs}
    unused = [n.name for n in graph.nodes if n.op == "placeholder" and not n.users and specs[n.name].target]
    assert unused == [], f"constants nothing reads: {unused}"
    targets = {s.target for s in specs.values() if s.target}
    stored = set(fused_ep.state_dict) | set(fused_ep.constants)
    assert stored <= targets, f"tensors stored for no input: {stored - targets}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_near_misses_are_reported_and_left_alone(programs, backend):
    policy = edgeplug.get_backend(backend).fusion_policy("rms_norm")
    bundle, ep, fused_ep, records = programs("refused", backend)
    assert not any(is_op(n, TARGET[policy.target]) for n in fused_ep.graph_module.graph.nodes)
    for case in REJECTED:
        recs = _records_of(bundle, ep, records, case)
        assert recs and all(r.outcome == "rejected" for r in recs), case.name
        assert any(case.reason in r.reason for r in recs), (case.name, [r.reason for r in recs])
    for case in UNRELATED:
        assert _records_of(bundle, ep, records, case) == []
    assert str(fused_ep.graph_module.graph) == str(ep.graph_module.graph)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_program_passes_the_edge_verifier(programs, backend):
    from executorch.exir import EdgeCompileConfig
    from executorch.exir.verification.verifier import EXIREdgeDialectVerifier

    b = edgeplug.get_backend(backend)
    for kind in ("decomposed", "whole"):
        _, _, fused_ep, _ = programs(kind, backend)
        # aten.rms_norm is not core ATen: it is legal where the backend keeps it whole
        # (and in the "whole" bundle, exported with it preserved)
        keep = [op for op in b.keep_whole if op == torch.ops.aten.rms_norm.default]
        if b.fusion_policy("rms_norm").target == "aten.rms_norm":
            assert keep, f"{backend} fuses into aten.rms_norm but does not keep it whole"
        if kind == "whole":
            keep = [torch.ops.aten.rms_norm.default]
        EXIREdgeDialectVerifier(edge_compile_config=EdgeCompileConfig(), class_only=True, preserve_ops=keep)()(
            fused_ep.graph_module
        )


def _tensors(table):
    return {k: (v, v.detach().clone()) for k, v in table.items()}


def _unchanged(table, before) -> bool:
    return table.keys() == before.keys() and all(
        table[k] is obj and torch.equal(table[k], value) for k, (obj, value) in before.items()
    )


def test_fuse_leaves_its_input_program_unchanged(programs):
    names = ("rsqrt", "gemma_one_plus_w", "static_view", "fp16_gemma_upcast", "runtime_scale", "weight_of_shape_1")
    bundle = Bundle([c for c in ACCEPTED if c.name in names])
    ep = bundle.edge_program()
    graph, signature = str(ep.graph_module.graph), str(ep.graph_signature)
    state, constants = _tensors(ep.state_dict), _tensors(ep.constants)
    fused_ep, records = edgeplug.fuse(ep, NARROW)
    assert fused_ep is not ep
    # folding wrote new constants (folded weights, unit weights) and dropped the parameters they replaced
    assert {r.outcome for r in records} == {"fused", "folded_weight", "fused_unit_weight"}
    assert fused_ep.constants.keys() - ep.constants.keys() and ep.state_dict.keys() - fused_ep.state_dict.keys()
    # ... in the copy only: the input's graph, signature and every constant table hold what they held
    assert str(ep.graph_module.graph) == graph and str(ep.graph_signature) == signature
    assert _unchanged(ep.state_dict, state) and _unchanged(ep.constants, constants)
    with torch.no_grad():
        for want, got in zip(bundle(*bundle.inputs()), ep.module()(*bundle.inputs())):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # fusing again finds nothing left to fuse
    again, more = edgeplug.fuse(fused_ep, NARROW)
    assert more == []


def test_backend_without_a_policy_gets_the_program_back(programs):
    _, ep, _, _ = programs("decomposed", NARROW)
    same, records = edgeplug.fuse(ep, TABLE)
    assert same is ep and records == []


def _with_policy(backend: str, **changes):
    b = edgeplug.get_backend(backend)
    policy = b.fusion_policy("rms_norm").model_copy(update=changes)
    return dataclasses.replace(b, fusion_policies=(policy,))


def test_policy_that_neither_folds_nor_falls_back_refuses_with_a_reason(programs):
    bundle, ep, _, _ = programs("decomposed", NARROW)
    strict = _with_policy(NARROW, fold_computed_constants=False, unit_weight_fallback=False)
    fused_ep, records = edgeplug.fuse(ep, strict)
    by_case = {c.name: _records_of(bundle, ep, records, c) for c in bundle.cases}
    for name in ("gemma_one_plus_w", "runtime_scale", "graph_input_gamma"):
        (r,) = by_case[name]
        assert r.outcome == "rejected" and "neither folds it nor fuses with a unit weight" in r.reason, r
    assert by_case["rsqrt"][0].outcome == "fused"
    with torch.no_grad():
        for case, e, g in zip(bundle.cases, bundle(*bundle.inputs()), fused_ep.module()(*bundle.inputs())):
            torch.testing.assert_close(g, e, rtol=case.tolerance(), atol=case.tolerance(), msg=case.name)


def test_policy_without_folding_keeps_the_computed_weight_multiply(programs):
    bundle, ep, _, _ = programs("decomposed", NARROW)
    fused_ep, records = edgeplug.fuse(ep, _with_policy(NARROW, fold_computed_constants=False))
    (r,) = _records_of(bundle, ep, records, next(c for c in ACCEPTED if c.name == "gemma_one_plus_w"))
    assert r.outcome == "fused_unit_weight" and "does not fold" in r.reason


def test_policy_naming_an_unknown_op_is_an_error(programs):
    _, ep, _, _ = programs("decomposed", NARROW)
    with pytest.raises(EdgeplugError, match=r"backend 'fixture-fused-narrow' names target 'mylib.rms_norm'.*edgeplug_fusion_policies"):
        edgeplug.fuse(ep, _with_policy(NARROW, target="mylib.rms_norm"))


def test_policy_records_are_valid_for_every_backend():
    for backend in BACKENDS:
        policy = edgeplug.get_backend(backend).fusion_policy("rms_norm")
        assert isinstance(policy, FusionPolicy) and policy.target in ("aten.rms_norm", OWN_OP)


@pytest.mark.parametrize("example,count,outcome", [("llama", 5, "fused"), ("gemma-block", 3, "folded_weight")])
def test_example_lowering_reports_every_fusion(edgeplug_lowering, example, count, outcome):
    result = edgeplug_lowering(example, KEEP, dry_run=True)
    fusions = result.report.fusions
    assert [f.outcome for f in fusions] == [outcome] * count
    table = result.report.to_table()
    assert f"fusions: {count}" in table
    assert all(f.anchor in table for f in fusions)


@pytest.mark.slow
def test_lowering_report_gives_each_refusal_its_reason():
    cases = tuple(c for c in ACCEPTED + REJECTED if c.name in ("rsqrt", "gemma_one_plus_w", "relu_between", "weight_of_shape_1"))
    bundle = Bundle(cases)
    result = edgeplug.lower(bundle, bundle.inputs(), KEEP, dry_run=True, model_name="near-misses")
    outcomes = sorted(f.outcome for f in result.report.fusions)
    assert outcomes == ["folded_weight", "fused", "fused_unit_weight", "rejected"]
    table = result.report.to_table()
    assert "sits between the norm and the weight multiply" in table
    assert "has shape (1,), not (16,): the norm is fused alone and the multiply stays" in table
    assert '"outcome": "rejected"' in result.report.to_json()


class _ThreeNorms(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(1 + 0.1 * torch.randn(D))
        self.dw = torch.nn.Parameter(0.1 * torch.randn(D))

    def forward(self, x, scale):
        def norm(t):
            return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)

        return norm(x) * self.w, norm(x + 1) * (1.0 + self.dw), norm(x.float()).to(x.dtype) * (1 + scale)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dynamic_sequence_length_fuses_and_runs_at_other_lengths(backend):
    from executorch.exir import to_edge

    model = _ThreeNorms().eval()
    seq = torch.export.Dim("seq", min=2, max=64)
    x, scale = torch.randn(2, 8, D), 0.1 * torch.rand(1, 1, D)
    ep = to_edge(torch.export.export(model, (x, scale), dynamic_shapes=({1: seq}, None))).exported_program()
    fused_ep, records = edgeplug.fuse(ep, backend)
    assert [r.outcome for r in records] == ["fused", "folded_weight", "fused_unit_weight"]
    for length in (3, 8, 29):
        x = torch.randn(2, length, D)
        with torch.no_grad():
            for got, want in zip(fused_ep.module()(x, scale), model(x, scale)):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class _SharedGemmaWeight(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dw = torch.nn.Parameter(0.1 * torch.randn(D))

    def forward(self, x, y):
        def norm(t):
            return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)

        scale = 1.0 + self.dw  # one computed weight, two norms
        return norm(x) * scale, norm(y) * scale


@pytest.mark.parametrize("backend", [KEEP, NARROW])
def test_two_norms_sharing_a_computed_weight_share_one_folded_constant(backend):
    from executorch.exir import to_edge

    model = _SharedGemmaWeight().eval()
    args = (torch.randn(2, 8, D), torch.randn(3, D))
    ep = to_edge(torch.export.export(model, args)).exported_program()
    fused_ep, records = edgeplug.fuse(ep, backend)
    assert [r.outcome for r in records] == ["folded_weight", "fused"]
    assert records[0].weight == records[1].weight
    with torch.no_grad():
        for got, want in zip(fused_ep.module()(*args), model(*args)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class _InverseCastFirst(nn.Module):
    """bf16 norms whose inverse RMS is rounded to bf16 before it scales x: not an RMSNorm the core fuses."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(D, dtype=torch.bfloat16))

    def forward(self, x):
        def inverse(t):
            return torch.rsqrt(t.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(t.dtype)

        return x * inverse(x) * self.w, x * inverse(x + 1)  # weighted, and unweighted


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_norm_has_a_record_even_when_nothing_matches_it(backend):
    from executorch.exir import to_edge

    x = torch.randn(2, 8, D).to(torch.bfloat16)
    ep = to_edge(torch.export.export(_InverseCastFirst(), (x,))).exported_program()
    rsqrts = [n.name for n in ep.graph_module.graph.nodes if is_op(n, "aten::rsqrt")]
    fused_ep, records = edgeplug.fuse(ep, backend)
    assert len(rsqrts) == 2 and sorted(r.anchor for r in records) == sorted(rsqrts)
    for r in records:
        assert r.outcome == "rejected" and "is the inverse RMS of a mean" in r.reason and "left as it is" in r.reason
    assert str(fused_ep.graph_module.graph) == str(ep.graph_module.graph)


class _Bf16Norms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter((1 + 0.1 * torch.randn(D, generator=torch.Generator().manual_seed(3))).to(torch.bfloat16))

    def forward(self, x):
        def norm(t):
            return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)

        # computed in bf16; and in an fp32 upcast, cast back before the weight
        return norm(x) * self.w, norm(x.float()).to(x.dtype) * self.w


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fused_op_the_backend_would_not_delegate_is_not_created(backend):
    from executorch.exir import to_edge

    x = torch.randn(2, 8, D).to(torch.bfloat16)
    ep = to_edge(torch.export.export(_Bf16Norms(), (x,))).exported_program()
    policy = edgeplug.get_backend(backend).fusion_policy("rms_norm")
    fused_ep, (in_bf16, upcast) = edgeplug.fuse(ep, backend)
    # no backend here delegates its fused op in bf16: refused with the backend's own reason
    assert in_bf16.outcome == "rejected", in_bf16
    assert f"the {backend} backend would not delegate {policy.target} in bfloat16" in in_bf16.reason
    assert "so it is not created" in in_bf16.reason
    # the fp32 math of the upcast norm is fused in fp32 (with fp32 accumulation too: outside the casts, not absorbed)
    assert upcast.outcome in ("fused", "folded_weight"), upcast
    (node,) = [n for n in fused_ep.graph_module.graph.nodes if is_op(n, TARGET[policy.target])]
    assert node.meta["val"].dtype == torch.float32
    with torch.no_grad():
        for got, want in zip(fused_ep.module()(x), ep.module()(x)):
            torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    # fuse_program with the policy alone (no backend, no support check) fuses what it matches
    from edgeplug._fusion.program import fuse_program

    _, unchecked = fuse_program(ep, policy)
    assert unchecked[0].outcome == "fused"


def test_policy_check_names_what_to_fix():
    from edgeplug._fusion.target import PolicyTargetError, check_policy

    good = edgeplug.get_backend(NARROW).fusion_policy("rms_norm")
    check_policy(good)
    assert good.emits == "edgeplug_fixture.rms_norm(input, weight, eps)"
    with pytest.raises(PolicyTargetError, match=r"not a registered operator.*give load_target"):
        check_policy(good.model_copy(update={"target": "mylib.rms_norm", "load_target": None}))
    aten_layout = good.model_copy(update={"arguments": ("input", "normalized_shape", "weight", "eps")})
    with pytest.raises(PolicyTargetError, match=r"does not take the policy's arguments.*FusionPolicy.arguments"):
        check_policy(aten_layout)
    swapped = good.model_copy(update={"arguments": ("input", "eps", "weight")})
    with pytest.raises(PolicyTargetError, match=r"'weight' .* is Tensor, but the policy passes the eps.*FusionPolicy.arguments"):
        check_policy(swapped)
    with pytest.raises(ValueError, match="must name input, weight and eps once each"):
        FusionPolicy(backend=NARROW, target="aten.rms_norm", arguments=("input", "eps"))


@pytest.mark.slow
def test_bf16_norm_lowers_and_serializes():
    """Issue 15: a bf16 fused op the partitioner refuses used to die at serialization."""

    class Norm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.RMSNorm(D, eps=1e-6).to(torch.bfloat16)

        def forward(self, x):
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            return h * self.norm.weight

    result = edgeplug.lower(Norm().eval(), (torch.randn(2, 8, D).to(torch.bfloat16),), FUSED)
    (record,) = result.report.fusions
    assert record.outcome == "rejected" and f"would not delegate {OWN_OP} in bfloat16" in record.reason
    assert "edgeplug_fixture" not in str(result.edge.exported_program().graph_module.code)


@pytest.mark.parametrize("backend", [KEEP, NARROW])
def test_fuse_program_runs_on_the_aten_program(backend):
    """What quantization does before prepare_pt2e: the policy-level fuser on torch.export's program."""
    from edgeplug._fusion.program import fuse_program

    names = ("rsqrt", "gemma_one_plus_w", "runtime_scale", "pow_tensor_exponent")
    bundle = Bundle([c for c in ACCEPTED if c.name in names])
    with torch.no_grad():
        ep = torch.export.export(bundle, bundle.inputs())
    assert ep.dialect != "EDGE"
    policy = edgeplug.get_backend(backend).fusion_policy("rms_norm")
    fused_ep, records = fuse_program(ep, policy)
    by_case = dict(zip([c.name for c in bundle.cases], records))
    assert [by_case[n].outcome for n in names] == ["fused", "folded_weight", "fused_unit_weight", "fused"]
    assert len([n for n in fused_ep.graph.nodes if is_op(n, TARGET[policy.target])]) == len(names)
    with torch.no_grad():
        for case, want, got in zip(bundle.cases, bundle(*bundle.inputs()), fused_ep.module()(*bundle.inputs())):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=case.name)
