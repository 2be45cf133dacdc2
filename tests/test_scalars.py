"""resolve_scalar on real exported programs, aten and edge dialect."""

from __future__ import annotations

import pytest
import torch

from edgeplug._graph import resolve_scalar


class Scalars(torch.nn.Module):
    """Every way model code hands an op a scalar, each feeding its own output."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(0.5))
        self.register_buffer("eps", torch.tensor(1e-5))
        self.register_buffer("step", torch.tensor(0.0))
        self.register_buffer("vec", torch.tensor([2.0]))
        self.register_buffer("q", torch.tensor(7, dtype=torch.int8))
        self.c = torch.tensor(0.25)  # a lifted constant tensor

    def forward(self, x):
        self.step.add_(1.0)  # mutated in the graph: not a compile-time constant
        outs = {
            "param": x * self.scale,
            "buffer": x + self.eps,
            "constant": x * self.c,
            "literal_tensor": x + torch.tensor(3.0),  # lift_fresh_copy + detach_
            "detach": x * self.c.detach(),
            "clone": x * self.c.clone(),
            "to_half": x.half() * self.c.to(torch.float16),
            "alias": x * torch.ops.aten.alias(self.c),
            "dequant": x
            * torch.ops.quantized_decomposed.dequantize_per_tensor(self.q, 0.5, 1, -128, 127, torch.int8),
            "mutated": x * self.step,
            "vector": x * self.vec,
            "computed": x * (self.c * 2),
            "random": x * torch.rand(()),
            "input": x * x.sum(),
        }
        return tuple(outs.values())


KEYS = [
    "param", "buffer", "constant", "literal_tensor", "detach", "clone", "to_half", "alias",
    "dequant", "mutated", "vector", "computed", "random", "input",
]
EXPECTED = {
    "param": 0.5,
    "buffer": torch.tensor(1e-5).item(),  # float32 rounding of the buffer
    "constant": 0.25,
    "literal_tensor": 3.0,
    "detach": 0.25,
    "clone": 0.25,
    "to_half": 0.25,
    "alias": 0.25,
    "dequant": 3.0,  # (7 - 1) * 0.5
    "mutated": None,
    "vector": None,  # shape (1,), not a scalar
    "computed": None,
    "random": None,
    "input": None,
}


def _scalar_operand(out_node: torch.fx.Node) -> torch.fx.Node:
    """The non-``x`` operand of the op producing one output."""
    (_, operand) = out_node.args[:2]
    return operand


def _outputs(ep) -> dict[str, torch.fx.Node]:
    out = next(n for n in ep.graph.nodes if n.op == "output")
    kinds = [s.kind.name for s in ep.graph_signature.output_specs]
    users = [n for n, k in zip(out.args[0], kinds) if k == "USER_OUTPUT"]
    return dict(zip(KEYS, users, strict=True))


@pytest.fixture(scope="module")
def aten_ep():
    import torch.ao.quantization.fx._decomposed  # noqa: F401  registers quantized_decomposed

    return torch.export.export(Scalars(), (torch.randn(4),))


@pytest.fixture(scope="module")
def edge_ep(aten_ep):
    from executorch.exir import EdgeCompileConfig, to_edge

    ep = torch.export.export(Scalars(), (torch.randn(4),))
    return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()


@pytest.mark.parametrize("key", KEYS)
def test_aten_operands(aten_ep, key):
    node = _scalar_operand(_outputs(aten_ep)[key])
    assert resolve_scalar(node, aten_ep) == EXPECTED[key]


def test_the_wrappers_are_really_in_the_graph(aten_ep):
    # guard against a vacuous test: export must have left each wrapper in place
    outs = _outputs(aten_ep)
    targets = {k: str(_scalar_operand(outs[k]).target) for k in ("literal_tensor", "detach", "clone", "to_half", "alias", "dequant")}
    assert targets["literal_tensor"] == "aten.detach_.default"
    assert targets["detach"] == "aten.detach.default"
    assert targets["clone"] == "aten.clone.default"
    assert targets["to_half"] == "aten.to.dtype"
    assert targets["alias"] == "aten.alias.default"
    assert "dequantize_per_tensor" in targets["dequant"]


@pytest.fixture(scope="module")
def core_aten_ep(aten_ep):
    # run_decompositions gives the core ATen IR: functional, ``to`` becomes ``_to_copy``
    return torch.export.export(Scalars(), (torch.randn(4),)).run_decompositions({})


@pytest.mark.parametrize("key", KEYS)
def test_core_aten_operands(core_aten_ep, key):
    node = _scalar_operand(_outputs(core_aten_ep)[key])
    assert resolve_scalar(node, core_aten_ep) == EXPECTED[key]


def test_core_aten_has_to_copy_and_a_buffer_mutation(core_aten_ep):
    outs = _outputs(core_aten_ep)
    assert str(_scalar_operand(outs["to_half"]).target) == "aten._to_copy.default"
    kinds = {s.kind.name for s in core_aten_ep.graph_signature.output_specs}
    assert "BUFFER_MUTATION" in kinds


@pytest.mark.parametrize("key", ["param", "buffer", "constant", "literal_tensor", "clone", "to_half", "dequant", "mutated", "vector", "random", "input"])
def test_edge_operands(edge_ep, key):
    node = _scalar_operand(_outputs(edge_ep)[key])
    assert resolve_scalar(node, edge_ep) == EXPECTED[key]


def test_edge_lifts_literal_scalars_into_buffers():
    # to_edge turns Python scalars into 0-d buffers; an int one added to a
    # float tensor sits behind a _to_dim_order_copy cast
    from executorch.exir import EdgeCompileConfig, to_edge

    class AddEps(torch.nn.Module):
        def forward(self, x):
            return x.pow(2).mean(-1, keepdim=True) + 1e-6, x + 2

    ep = to_edge(torch.export.export(AddEps(), (torch.randn(2, 4),)), compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    adds = [n for n in ep.graph.nodes if "aten.add" in str(n.target)]
    eps, two = adds[0].args[1], adds[1].args[1]
    assert eps.op == "placeholder" and "dim_order" in str(two.target)
    assert resolve_scalar(eps, ep) == pytest.approx(1e-6, rel=1e-6)
    assert resolve_scalar(two, ep) == 2.0
    assert resolve_scalar(adds[0].args[0], ep) is None


def test_cast_rounds_like_the_runtime(aten_ep):
    # _to_copy is evaluated on the real tensor, so a float16 cast rounds
    class Half(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.tensor(0.1)

        def forward(self, x):
            return x * self.c.to(torch.float16)

    ep = torch.export.export(Half(), (torch.randn(2, dtype=torch.float16),))
    mul = next(n for n in ep.graph.nodes if n.op == "call_function" and "mul" in str(n.target))
    assert resolve_scalar(mul.args[1], ep) == torch.tensor(0.1, dtype=torch.float16).item() != 0.1


def test_python_values():
    assert resolve_scalar(3, None) == 3
    assert resolve_scalar(1e-6, None) == 1e-6
    value = resolve_scalar(True, None)
    assert value is True
    assert resolve_scalar(torch.tensor(2.5), None) == 2.5
    assert isinstance(resolve_scalar(torch.tensor(4), None), int)
    assert resolve_scalar(torch.tensor([2.5]), None) is None
    assert resolve_scalar("eps", None) is None
    assert resolve_scalar(None, None) is None
