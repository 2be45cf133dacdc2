"""``BackendSpec.support_check`` may take the program, so a backend's own checker (built over the program, as
ExecuTorch's TOSA and Ethos-U support checks are) can say why it refuses a node, and that reason reaches the report.

Before, the factory got the partitioner and a graph module only: a checker that needs the ``ExportedProgram`` could
not be asked, and the report said the backend "gave no reason" where the backend recorded one.
"""

from __future__ import annotations

import types

from torch.export import ExportedProgram

import edgeplug
import edgeplug_fixture_backends as fb  # tests/fixtures/backends (put on the path by conftest)
from edgeplug.examples import load_model
from edgeplug.plugin import BackendSpec, hookimpl, op_name, refuse

NAME = "fixture-program-check"


class ProgramChecker:
    """A backend's own checker: built over the program, it records why it refuses each node (here: every gelu,
    which the partitioner leaves without a word)."""

    def __init__(self, program: ExportedProgram) -> None:
        self.program = program
        self.why = {n: f"MyChecker refuses {op_name(n)} (node {n.name} of a program of {len(program.graph.nodes)} nodes)"
                    for n in program.graph.nodes if n.op == "call_function" and "gelu" in op_name(n)}


def support_check(partitioner, graph_module, program=None):
    if program is None:  # before decomposition, and fusion's probes: no program to build over
        return partitioner.verdict
    assert isinstance(program, ExportedProgram) and program.graph_module is graph_module
    checker = ProgramChecker(program)
    return lambda node: refuse(checker.why[node]) if node in checker.why else partitioner.verdict(node)


def partitioner():
    """The fixture table's partitioner without gelu: it leaves gelu on the CPU, saying nothing itself."""
    from edgeplug.plugin import SupportTablePartitioner

    table = fb.table_partitioner()
    ops = [op for op in table.supported if "gelu" not in str(op)]
    return SupportTablePartitioner(table.backend_id, ops, dtypes=table.dtypes, name="gelu-less")


def _plugin(check):
    @hookimpl
    def edgeplug_backends():
        yield BackendSpec(backend=NAME, description="a support check over the program (an edgeplug test backend)",
                          backend_id=fb.BACKEND_IDS[fb.TABLE], partitioner=partitioner, support_check=check)

    return types.SimpleNamespace(edgeplug_backends=edgeplug_backends)


def _cpu_reasons(edgeplug_register, check):
    edgeplug_register(_plugin(check), name="program-check")
    model, inputs, _, _ = load_model("mlp")
    report = edgeplug.lower(model, inputs, NAME).report
    return {c.op: c.reason for c in report.cpu_nodes}


def test_a_support_check_taking_the_program_gives_its_checkers_reason(edgeplug_register):
    reasons = _cpu_reasons(edgeplug_register, support_check)
    gelu = [r for op, r in reasons.items() if "gelu" in op]
    assert len(gelu) == 1 and gelu[0].startswith("MyChecker refuses aten.gelu.default (node "), reasons


def test_a_support_check_without_the_program_parameter_is_called_as_before(edgeplug_register):
    def two_arguments(partitioner, graph_module):
        return partitioner.verdict

    reasons = _cpu_reasons(edgeplug_register, two_arguments)
    assert [r for op, r in reasons.items() if "gelu" in op] == [
        "aten.gelu.default is not in the gelu-less support table"
    ], reasons
