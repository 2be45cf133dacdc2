"""A dry run of a backend that can compile here runs its compile step: what the delegate's preprocess refuses fails
the dry run as it fails the real lowering. Before, ``--dry-run`` passed where the real lowering failed in the
backend's preprocess ("unsupported param type"), since the stand-in replaced the preprocess whatever the machine had.
Where the compile step cannot run (the backend unavailable: no SDK), the dry run still stands in for it.
"""

from __future__ import annotations

import types

import pytest

import edgeplug
from edgeplug.examples import load_model
from edgeplug.plugin import Availability, BackendSpec, hookimpl

ID = "EdgeplugPickyBackend"
_KEPT: list[type] = []  # the BackendDetails class, kept alive (executorch finds it among the live subclasses)


def _picky_partitioner():
    import torch
    from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult

    from edgeplug.plugin import SupportTablePartitioner

    if not _KEPT:
        def preprocess(edge_program, compile_specs):
            if any("gelu" in str(n.target) for n in edge_program.graph.nodes):
                raise ValueError("picky compiler: unsupported param type for gelu")
            return PreprocessResult(processed_bytes=b"ok")

        _KEPT.append(type(ID, (BackendDetails,), {"preprocess": staticmethod(preprocess)}))
    a = torch.ops.aten
    ops = [a.linear.default, a.addmm.default, a.permute_copy.default, a.gelu.default]
    return SupportTablePartitioner(ID, ops, name="picky")


def _lower(edgeplug_register, available: bool, dry_run: bool):
    name = f"picky-{str(available).lower()}-{'dry' if dry_run else 'real'}"

    @hookimpl
    def edgeplug_backends():
        yield BackendSpec(backend=name, description="a compile step that refuses gelu (an edgeplug test backend)",
                          backend_id=ID, partitioner=_picky_partitioner,
                          availability=lambda: Availability(ok=available, reason="" if available else "no picky SDK",
                                                            hint="" if available else "install it"))

    edgeplug_register(types.SimpleNamespace(edgeplug_backends=edgeplug_backends), name=name)
    model, inputs, _, _ = load_model("mlp")
    return edgeplug.lower(model, inputs, name, dry_run=dry_run)


def test_a_dry_run_fails_where_the_compile_step_that_can_run_here_refuses(edgeplug_register):
    with pytest.raises(edgeplug.LoweringError, match="picky compiler: unsupported param type for gelu") as real:
        _lower(edgeplug_register, available=True, dry_run=False)
    with pytest.raises(edgeplug.LoweringError, match="picky compiler: unsupported param type for gelu") as dry:
        _lower(edgeplug_register, available=True, dry_run=True)
    # the same stage, the same words (the two backends' names aside), the compile step's line named
    assert str(dry.value).replace("-dry", "-real") == str(real.value)
    assert "stage 'partition + delegate' failed" in str(dry.value) and f"{__file__}:" in str(dry.value)


def test_without_the_compile_step_here_the_dry_run_stands_in(edgeplug_register):
    result = _lower(edgeplug_register, available=False, dry_run=True)
    assert result.report.dry_run and result.report.partitions and result.program is None
