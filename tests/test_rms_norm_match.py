"""match_rms_norm on real edge programs: every accepted spelling, every refusal with its reason."""

from __future__ import annotations

import math

import pytest
import torch

from edgeplug._graph import analyze_constants
from edgeplug._graph.constants import constant_value
from edgeplug._fusion.rms_norm import NoMatch, RmsNormMatch, match_rms_norm
from edgeplug.testing.rms_norm_cases import ACCEPTED, D, REJECTED, ROUNDED, UNRELATED, WHOLE, Bundle


def _by_case(bundle: Bundle, ep):
    """case name -> the matches and reported refusals among that case's nodes."""
    owner = bundle.case_of(ep)
    analysis = analyze_constants(ep)
    found: dict[str, list] = {c.name: [] for c in bundle.cases}
    for node in ep.graph_module.graph.nodes:
        result = match_rms_norm(node, ep, analysis=analysis)
        if result or result.candidate:
            found[owner[node].name].append(result)
    return found


@pytest.fixture(scope="module")
def decomposed():
    bundle = Bundle(ACCEPTED)  # to_edge decomposes nn.RMSNorm and F.rms_norm here
    ep = bundle.edge_program()
    return bundle, ep, _by_case(bundle, ep)


@pytest.fixture(scope="module")
def whole():
    bundle = Bundle(WHOLE)  # aten.rms_norm kept whole, as a backend whose runtime has the op keeps it
    ep = bundle.edge_program()
    return bundle, ep, _by_case(bundle, ep)


@pytest.fixture
def accepted(request, decomposed, whole):
    return whole if request.node.callspec.params["case"].whole else decomposed


@pytest.fixture(scope="module")
def refused():
    bundle = Bundle(REJECTED + UNRELATED)
    ep = bundle.edge_program()
    return bundle, ep, _by_case(bundle, ep)


def _placeholder_value(ep, node):
    value = constant_value(ep, node)
    assert value is not None, f"{node.name} is not a constant of the program"
    return value


@pytest.mark.parametrize("case", [c for c in ACCEPTED + WHOLE if c.accept], ids=lambda c: c.name)
def test_accepted_spelling_matches_with_its_arguments(accepted, case):
    bundle, ep, found = accepted
    results = found[case.name]
    assert len(results) == 1, f"{case.name}: expected one match, got {results}"
    (m,) = results
    assert isinstance(m, RmsNormMatch), f"{case.name} refused: {getattr(m, 'reason', m)}"
    assert m.dim == D
    assert math.isclose(m.eps, case.eps, rel_tol=1e-6, abs_tol=0.0), (m.eps, case.eps)
    assert m.eps_given == (case.name not in ("whole_default_eps", "whole_fp16_default_eps"))
    assert m.weight_source == case.weight
    assert m.anchor in m.nodes and m.output in m.nodes
    module = bundle.parts[bundle.cases.index(case)]
    if case.weight == "leaf":
        # the weight is the case's own parameter, whichever side of the multiply it is on
        expected = case.weight_value(module).detach()
        got = _placeholder_value(ep, m.weight)
        assert torch.equal(got.reshape(expected.shape), expected)
    elif case.weight == "runtime":
        assert m.weight.op == "placeholder" or m.weight.op == "call_function"
        assert analyze_constants(ep).source(m.weight) == "runtime"
    elif case.weight is None:
        assert m.weight is None and m.weight_mul is None
    # a multiply by something that is not a [D] weight is named, and left to stay
    assert (m.scale_mul is not None) == case.scale and bool(m.scale_reason) == case.scale
    # the normalised input is the case's input (or its fp32 upcast)
    x = m.upcast.args[0] if m.upcast is not None else m.input
    assert x.op == "placeholder" and x.meta["val"].dtype == case.dtype
    if case.name.startswith("fp16_"):
        assert m.upcast is not None and m.input.meta["val"].dtype == torch.float32
    if case.name == "fp16_upcast":
        assert m.cast_back is not None and m.cast_back.meta["val"].dtype == torch.float16
    if case in ROUNDED:  # matched through the ops between the norm and the weight multiply
        assert m.between and m.weight_mul is not None


@pytest.mark.parametrize("case", REJECTED + tuple(c for c in WHOLE if not c.accept), ids=lambda c: c.name)
def test_near_miss_is_refused_with_its_reason(refused, whole, case):
    _, _, found = whole if case.whole else refused
    results = found[case.name]
    assert results, f"{case.name}: nothing reported"
    assert not any(results), f"{case.name} matched: {results}"
    reasons = [r.reason for r in results]
    assert any(case.reason in r for r in reasons), f"{case.name}: {reasons} lacks {case.reason!r}"
    assert all(isinstance(r, NoMatch) and r.candidate for r in results)


@pytest.mark.parametrize("case", UNRELATED, ids=lambda c: c.name)
def test_unrelated_graph_is_not_a_candidate(refused, case):
    _, _, found = refused
    assert found[case.name] == []


def test_matching_never_changes_the_graph(decomposed):
    _, ep, _ = decomposed
    before = str(ep.graph_module.graph)
    for node in list(ep.graph_module.graph.nodes):
        match_rms_norm(node, ep)
    assert str(ep.graph_module.graph) == before


def test_no_match_is_falsy_and_says_why(refused):
    _, ep, _ = refused
    placeholder = next(n for n in ep.graph_module.graph.nodes if n.op == "placeholder")
    result = match_rms_norm(placeholder, ep)
    assert not result and isinstance(result, NoMatch) and not result.candidate
    assert result.reason
