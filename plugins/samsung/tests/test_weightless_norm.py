"""samsung fuses a norm with no weight of its own as ``aten.rms_norm(x, [D], ones, eps)``.

ENN's RMSNORM builder and EnnQuantizer's rms_norm annotator read argument 2 as a tensor, so
samsung's policy (``weightless="ones"``) gives such a norm a constant of ones of the normalised
width, in the norm's dtype, that its fusion record names: a decomposed norm without a weight, the
``F.rms_norm(x, shape)`` spellings, a norm whose output is also used elsewhere (its weight
multiply stays), and a norm fused alone before a runtime scale (the scale is never folded into the
weight). The cases are the conformance catalogue's (``edgeplug.testing.rms_norm_cases``).

ENN's builder module cannot be imported without the Exynos SDK; the dry-run test applies to
argument 2 the executorch functions its ``define_tensor`` calls (``is_param_node``,
``get_param_tensor``) to read a constant's data.
"""

from __future__ import annotations

import pytest
import torch

import edgeplug
from edgeplug._graph.constants import constant_value
from edgeplug.testing.rms_norm_cases import ACCEPTED, D, WHOLE, Bundle

RMS_NORM = torch.ops.aten.rms_norm.default
NAMES = ("no_weight", "norm_output_also_used", "f_rms_norm_no_weight", "whole_no_weight", "graph_input_gamma")
CASES = [c for c in ACCEPTED + WHOLE if c.name in NAMES]
UNIT = f"rms_norm_unit_weight_{D}_float32"


def _case(name):
    return next(c for c in CASES if c.name == name)


@pytest.fixture(scope="module")
def bundle():
    return Bundle(CASES).eval()


@pytest.fixture(scope="module")
def fused(bundle):
    """The bundle's aten program (F.rms_norm stays whole in export), fused for samsung."""
    with torch.no_grad():
        ep = torch.export.export(bundle, bundle.inputs())
    out, records = edgeplug.fuse(ep, "samsung")
    return ep, out, records


def _norm_of(bundle, ep, case):
    owner = bundle.case_of(ep)
    return [n for n in ep.graph_module.graph.nodes if n.target is RMS_NORM and owner.get(n) is case]


def test_every_weightless_norm_fuses_with_a_ones_constant_the_record_names(bundle, fused):
    ep, out, records = fused
    assert len(records) == len(CASES) and all(r.outcome != "rejected" for r in records), records
    owner = {n.name: c for n, c in bundle.case_of(ep).items()}
    for case in CASES:
        (record,) = [r for r in records if owner.get(r.anchor) is case]
        (node,) = _norm_of(bundle, out, case)
        x, shape, weight, eps = node.args
        assert list(shape) == [D] and eps == pytest.approx(case.eps, rel=1e-6), node.args
        assert isinstance(weight, torch.fx.Node) and weight.op == "placeholder", f"{case.name}: weight {weight!r}"
        value = constant_value(out, weight)
        assert value is not None, f"{case.name}: the weight is not a constant of the program"
        assert value.dtype == torch.float32 and torch.equal(value, torch.ones(D)), value
        assert record.weight == weight.name and UNIT in record.weight, record
    # one constant per norm (a constant two partitions shared would become a runtime input of both)
    assert len({n.args[2] for n in out.graph_module.graph.nodes if n.target is RMS_NORM}) == len(CASES)


def test_the_fused_program_matches_eager(bundle, fused):
    _, out, _ = fused
    inputs = bundle.inputs()
    with torch.no_grad():
        want, got = bundle(*inputs), out.module()(*inputs)
    for case, w, g in zip(bundle.cases, want, got):
        diff = (w - g).abs().max().item()
        assert diff <= case.tolerance(), f"{case.name}: max |diff| {diff}"


def test_the_output_also_used_form_keeps_its_multiply_after_the_fused_norm(bundle, fused):
    _, out, _ = fused
    (node,) = _norm_of(bundle, out, _case("norm_output_also_used"))
    users = sorted(str(u.target) for u in node.users)
    assert users == ["aten.add.Tensor", "aten.mul.Tensor"], users
    (mul,) = [u for u in node.users if u.target is torch.ops.aten.mul.Tensor]
    (w,) = [a for a in mul.args if a is not node]
    assert not torch.equal(constant_value(out, w), torch.ones(D)), "the case's own weight multiplies the norm"


def test_a_runtime_weight_is_not_folded_into_the_fused_weight(bundle, fused):
    ep, out, records = fused
    case = _case("graph_input_gamma")
    owner = {n.name: c for n, c in bundle.case_of(ep).items()}
    (record,) = [r for r in records if owner.get(r.anchor) is case]
    assert record.outcome == "fused_unit_weight" and "runtime" in record.reason, record
    (node,) = _norm_of(bundle, out, case)
    (mul,) = node.users
    gamma = next(a for a in mul.args if a is not node)
    assert mul.target is torch.ops.aten.mul.Tensor and gamma.op == "placeholder"
    assert gamma.name in out.graph_signature.user_inputs, "the runtime gamma must stay a program input"
    assert torch.equal(constant_value(out, node.args[2]), torch.ones(D))


def test_the_strict_dry_run_delegates_each_norm_with_a_weight_enns_builder_reads(bundle):
    """A real lowering with the stand-in preprocess: every norm reaches ENN as aten.rms_norm, its argument 2
    a constant of the partition whose data is ones (what ENN's define_tensor serialises for it)."""
    from executorch.backends.transforms.utils import get_param_tensor, is_param_node
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    result = edgeplug.lower(bundle, bundle.inputs(), "samsung", dry_run=True, model_name="weightless-norms")
    report = result.report
    assert [f.outcome for f in report.fusions].count("rejected") == 0, report.fusions
    assert report.delegated_ops.get("aten.rms_norm.default") == len(CASES), report.to_table()
    weights = []
    for _name, lowered, _node in get_lowered_submodules(result.edge.exported_program().graph_module):
        part = lowered.original_module
        for n in part.graph.nodes:
            if n.op == "call_function" and "rms_norm" in str(n.target):
                gamma = n.args[2]
                assert isinstance(gamma, torch.fx.Node) and is_param_node(part, gamma), n.args
                weights.append(get_param_tensor(part, gamma))
    assert len(weights) == len(CASES)
    assert all(torch.equal(w, torch.ones(D)) for w in weights), weights


def test_a_weightless_norm_in_half_precision_gets_a_half_ones_weight():
    case = _case("no_weight")
    model = Bundle([case]).eval().half()
    x = case.inputs()[0].half()
    with torch.no_grad():
        ep = torch.export.export(model, (x,))
    out, (record,) = edgeplug.fuse(ep, "samsung")
    (node,) = [n for n in out.graph_module.graph.nodes if n.target is RMS_NORM]
    value = constant_value(out, node.args[2])
    assert value.dtype == torch.float16 and torch.equal(value, torch.ones(D, dtype=torch.float16))
    assert record.weight == node.args[2].name and "float16" in record.weight, record
    with torch.no_grad():
        diff = (out.module()(x)[0] - model(x)[0]).abs().max().item()
    assert diff <= 2e-2, diff
