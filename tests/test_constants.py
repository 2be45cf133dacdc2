"""constant_only_nodes, weight_source and fold_constant on real exported programs."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.export.graph_signature import InputKind

from edgeplug._graph import analyze_constants, constant_only_nodes, fold_constant, weight_source


def _edge(model: nn.Module, inputs: tuple):
    from executorch.exir import EdgeCompileConfig, to_edge

    return to_edge(torch.export.export(model, inputs), compile_config=EdgeCompileConfig(_check_ir_validity=False))


class Analysed(nn.Module):
    """One output per case the analysis must get right."""

    OUTPUTS = ("runtime", "gemma", "viewed", "chain", "ones", "dequant", "noisy", "counted", "table")

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8))
        self.register_buffer("b", torch.randn(8))
        self.register_buffer("count", torch.zeros(8))
        self.register_buffer("grid", torch.ones(4, 2))
        self.register_buffer("qw", torch.randint(-100, 100, (8,), dtype=torch.int8))
        self.c = torch.randn(8)  # lifted constant tensor

    def forward(self, x):
        self.count.add_(1.0)  # a buffer the program mutates
        self.grid[0].mul_(2.0)  # written through a view (select)
        gemma = 1 + self.w
        return (
            x * gemma,  # runtime
            gemma,  # computed: 1 + w
            self.b.view(2, 4).view(8),  # computed: static views
            (self.w * 2 - self.c).exp(),  # computed, transitively
            torch.ones(8),  # reads nothing: constant
            torch.ops.quantized_decomposed.dequantize_per_tensor(self.qw, 0.1, 0, -128, 127, torch.int8),  # leaf
            self.w + torch.randn_like(self.w),  # random
            self.count * 2,  # reads a mutated buffer
            self.grid.sum(0).repeat(4),  # reads a buffer written through a view
        )


EXPECTED_SOURCE = {
    "runtime": "runtime",
    "gemma": "computed",
    "viewed": "computed",
    "chain": "computed",
    "ones": "computed",
    "dequant": "leaf",
    "noisy": "runtime",
    "counted": "runtime",
    "table": "runtime",
}


def _user_outputs(ep) -> dict[str, torch.fx.Node]:
    out = next(n for n in ep.graph.nodes if n.op == "output")
    kinds = [s.kind for s in ep.graph_signature.output_specs]
    nodes = [n for n, k in zip(out.args[0], kinds) if k.name == "USER_OUTPUT"]
    return dict(zip(Analysed.OUTPUTS, nodes, strict=True))


def _placeholder(ep, target: str) -> torch.fx.Node:
    spec = next(s for s in ep.graph_signature.input_specs if s.target == target)
    return next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name == spec.arg.name)


@pytest.fixture(scope="module", params=["aten", "edge"])
def analysed(request):
    import torch.ao.quantization.fx._decomposed  # noqa: F401  registers quantized_decomposed

    model, inputs = Analysed().eval(), (torch.randn(8),)
    if request.param == "aten":  # torch.export's own IR: in-place ops, no mutation outputs
        return torch.export.export(model, inputs)
    return _edge(model, inputs).exported_program()  # functional: mutations are outputs


@pytest.mark.parametrize("name", Analysed.OUTPUTS)
def test_weight_source_of_each_output(analysed, name):
    node = _user_outputs(analysed)[name]
    assert weight_source(node, analysed) == EXPECTED_SOURCE[name]


def test_placeholders(analysed):
    assert weight_source(_placeholder(analysed, "w"), analysed) == "leaf"
    assert weight_source(_placeholder(analysed, "b"), analysed) == "leaf"
    assert weight_source(_placeholder(analysed, "c"), analysed) == "leaf"
    assert weight_source(_placeholder(analysed, "qw"), analysed) == "leaf"
    assert weight_source(_placeholder(analysed, "count"), analysed) == "runtime"
    assert weight_source(_placeholder(analysed, "grid"), analysed) == "runtime"
    x = next(n for n in analysed.graph.nodes if n.op == "placeholder" and n.name == "x")
    assert weight_source(x, analysed) == "runtime"


def test_constant_only_is_transitive_and_closed(analysed):
    const = constant_only_nodes(analysed)
    outs = _user_outputs(analysed)
    # everything a computed output reads is constant-only too
    for name in ("gemma", "viewed", "chain"):
        stack = [outs[name]]
        while stack:
            n = stack.pop()
            assert n in const, f"{n.name} (feeding {name}) should be constant-only"
            stack.extend(n.all_input_nodes)
    # nothing constant-only reads a node outside the set
    for n in const:
        assert all(a in const for a in n.all_input_nodes), n.name
    # and the negative cases, with everything downstream of them
    for name in ("runtime", "noisy", "counted", "table"):
        assert outs[name] not in const
    random = [n for n in analysed.graph.nodes if n.op == "call_function" and "randn_like" in str(n.target)]
    assert random and not (set(random) & const)
    assert not any(n.op == "output" for n in const)


def test_the_mutations_are_really_in_the_graph(analysed):
    # guard against a vacuous test: the program must really write both buffers
    sig = analysed.graph_signature
    mutated = {s.target for s in sig.output_specs if s.kind.name == "BUFFER_MUTATION"}
    inplace = {str(n.target) for n in analysed.graph.nodes if n.op == "call_function" and "_." in str(n.target)}
    assert mutated == {"count", "grid"} or {"aten.add_.Tensor", "aten.mul_.Tensor"} <= inplace


def test_analysis_is_shared_across_queries(analysed):
    analysis = analyze_constants(analysed)
    for name, node in _user_outputs(analysed).items():
        assert weight_source(node, analysed, analysis=analysis) == EXPECTED_SOURCE[name]


def test_weight_source_rejects_foreign_nodes(analysed):
    other = torch.export.export(nn.Linear(2, 2), (torch.randn(1, 2),))
    node = next(iter(other.graph.nodes))
    with pytest.raises(ValueError, match="not in this program's top-level graph"):
        weight_source(node, analysed)
    with pytest.raises(TypeError, match="torch.fx.Node"):
        weight_source("p_w", analysed)


# folding ---------------------------------------------------------------------


class GemmaNorm(nn.Module):
    """Gemma's RMSNorm: the weight the kernel needs is ``1 + w``."""

    def __init__(self, dim: int = 16, reuse_weight: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(0.1 * torch.randn(dim))
        self.reuse_weight = reuse_weight
        self.folded = torch.randn(dim)  # a constant already named like the default hint

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        out = h * (1.0 + self.weight) + self.folded
        return out + self.weight if self.reuse_weight else out


def _gemma_weight(ep) -> torch.fx.Node:
    analysis = analyze_constants(ep)
    (node,) = [n for n in ep.graph.nodes if n.op == "call_function" and "add" in str(n.target) and analysis.source(n) == "computed"]
    return node


def _inputs() -> tuple:
    return (torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(0)),)


@pytest.fixture(scope="module")
def folded_edge():
    torch.manual_seed(0)
    model = GemmaNorm().eval()
    edge = _edge(model, _inputs())
    ep = edge.exported_program()
    node = _gemma_weight(ep)
    placeholder = fold_constant(ep, node)
    return model, edge, ep, placeholder


def test_fold_registers_a_lifted_constant(folded_edge):
    model, _, ep, ph = folded_edge
    spec = next(s for s in ep.graph_signature.input_specs if s.arg.name == ph.name)
    assert spec.kind == InputKind.CONSTANT_TENSOR
    assert spec.target not in ("folded", "weight")  # "folded" was taken by the model's own constant
    torch.testing.assert_close(ep.constants[spec.target], 1.0 + model.weight.detach())
    assert ph.op == "placeholder" and ph.meta["val"].shape == (16,)
    assert weight_source(ph, ep) == "leaf"
    # the parameter only fed 1 + w: it is gone from the graph, signature and state
    assert "weight" not in ep.state_dict
    assert all(s.target != "weight" for s in ep.graph_signature.input_specs)
    assert not [n for n in ep.graph.nodes if n.op == "call_function" and analyze_constants(ep).source(n) == "computed"]
    ep.graph.lint()


def test_folded_program_runs(folded_edge):
    model, _, ep, _ = folded_edge
    x = _inputs()[0]
    torch.testing.assert_close(ep.module()(x), model(x))


@pytest.mark.slow
def test_folded_constant_is_serialized_as_a_constant(folded_edge):
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    model, edge, ep, ph = folded_edge
    program = edge.to_executorch()
    plan = program.executorch_program.execution_plan[0]
    constants = [v.val for v in plan.values if type(v.val).__name__ == "Tensor" and v.val.data_buffer_idx > 0]
    assert [16] in [list(t.sizes) for t in constants]
    x = _inputs()[0]
    (out,) = _load_for_executorch_from_buffer(program.buffer).forward((x,))
    torch.testing.assert_close(out, model(x))


def test_fold_keeps_a_parameter_still_in_use():
    model = GemmaNorm(reuse_weight=True).eval()
    ep = _edge(model, _inputs()).exported_program()
    ph = fold_constant(ep, _gemma_weight(ep), name_hint="gemma.weight")
    assert ph.name == "c_gemma_weight"
    assert "weight" in ep.state_dict
    x = _inputs()[0]
    torch.testing.assert_close(ep.module()(x), model(x))


def test_fold_on_torch_export_ir_and_unique_names():
    class TwoViews(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            return x @ self.w.t(), self.w.sum(0) * 3  # two computed outputs, one a user output

    model = TwoViews().eval()
    ep = torch.export.export(model, (torch.randn(2, 4),))
    t = next(n for n in ep.graph.nodes if str(n.target) == "aten.t.default")
    first = fold_constant(ep, t, name_hint="w")  # "w" is the parameter's own name
    out_node = next(n for n in ep.graph.nodes if n.op == "output").args[0][1]
    second = fold_constant(ep, out_node, name_hint="w")
    targets = {s.arg.name: s.target for s in ep.graph_signature.input_specs}
    assert len({targets[first.name], targets[second.name], "w"}) == 3
    assert ep.graph_signature.output_specs[1].arg.name == second.name  # the output now reads the constant
    assert "w" not in ep.state_dict
    x = torch.randn(2, 4)
    for got, want in zip(ep.module()(x), model(x)):
        torch.testing.assert_close(got, want)


def test_fold_refuses_runtime_and_dequantized_weights(analysed):
    outs = _user_outputs(analysed)
    for name in ("runtime", "noisy", "counted"):
        with pytest.raises(ValueError, match="not a compile-time constant"):
            fold_constant(analysed, outs[name])
    with pytest.raises(ValueError, match="unquantized"):
        fold_constant(analysed, outs["dequant"])
    w = _placeholder(analysed, "w")
    assert fold_constant(analysed, w) is w  # a leaf is already a constant


def test_fold_constants_folds_a_batch():
    from edgeplug.examples.llama import gemma_style_block
    from edgeplug._graph import fold_constants

    model, inputs = gemma_style_block()
    ep = _edge(model, inputs).exported_program()
    analysis = analyze_constants(ep)
    targets = [n for n in ep.graph.nodes if n.op == "call_function" and analysis.source(n) == "computed" and n.users]
    assert len(targets) >= 3  # 1 + w of both block norms and the final norm (and what feeds them)
    placeholders = fold_constants(ep, targets + targets[:1], name_hint="norm_weight")
    assert placeholders[-1] is None  # already folded earlier in the batch
    names = [p.name for p in placeholders if p is not None]
    assert len(names) == len(set(names))
    assert all(weight_source(p, ep) == "leaf" for p in placeholders if p is not None)
    assert not [n for n in ep.graph.nodes if n.op == "call_function" and analyze_constants(ep).source(n) == "computed"]
    torch.testing.assert_close(ep.module()(*inputs), model(*inputs))


def test_fold_constants_changes_nothing_when_one_node_is_refused():
    model = GemmaNorm().eval()
    ep = _edge(model, _inputs()).exported_program()
    before = [n.name for n in ep.graph.nodes]
    runtime = next(n for n in ep.graph.nodes if n.op == "call_function" and "rsqrt" in str(n.target))
    from edgeplug._graph import fold_constants

    with pytest.raises(ValueError, match="not a compile-time constant"):
        fold_constants(ep, [_gemma_weight(ep), runtime])
    assert [n.name for n in ep.graph.nodes] == before
    assert "weight" in ep.state_dict
