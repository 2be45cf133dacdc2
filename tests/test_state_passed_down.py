"""One owner of state (issue 48): a backend name becomes a ``Backend`` once, at the façade, against the
registry the caller chose; everything below reads that ``Backend`` and never the process's plugin manager.

- A backend only a caller's own ``PluginManager`` knows quantizes and lowers with verification, end to
  end (before, ``quantize`` asked the process's manager for the backend's schemes: "has no quantizer").
- One lowering calls the backend's partitioner factory once: the fusion's delegation veto and the lowering
  share the partitioner (before: once for the lowering, once more for the veto).
- The flags are checked once, where they enter, with one error class.
"""

from __future__ import annotations

import types

import pytest
import torch

import edgeplug
from edgeplug._registry import PluginManager


class _NormLinear(torch.nn.Module):
    """An RMSNorm (the fusion's veto is asked about it) before a linear (what the scheme quantizes)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(8) + 0.5)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight)


@pytest.fixture
def own_registry(monkeypatch):
    """The fixture backends and an 8a8w scheme for fixture-fused, in a registry of the test's own: the
    process's registry knows neither (no entry point loads, nothing is registered there)."""
    import edgeplug_fixture_backends as fb
    import edgeplug_fixture_quant as fq
    import executorch.kernels.quantized  # noqa: F401  (the CPU's quantize/dequantize out variants)

    monkeypatch.setenv("EDGEPLUG_PLUGINS", "no-entry-point-plugin")
    calls: list[str] = []
    factory = fb.fused_partitioner

    def counted() -> object:
        calls.append("partitioner")
        return factory()

    monkeypatch.setattr(fb, "fused_partitioner", counted)  # read when the registry loads the fixture's hooks

    def edgeplug_quantizers():
        yield edgeplug.QuantScheme(
            backend=fb.FUSED, scheme="8a8w", factory=fq.quantizer, activation_bits=8, weight_bits=8,
            per_channel=True, description="linears and whole norms, 8-bit (an edgeplug test scheme)",
        )

    m = PluginManager()
    m.register(fb, "fixture-backends-own")
    m.register(types.SimpleNamespace(edgeplug_quantizers=edgeplug.hookimpl(edgeplug_quantizers)), "fixture-scheme-own")
    return m, fb, calls


def test_a_backend_of_a_registry_of_ones_own_quantizes_and_lowers_with_verification(own_registry):
    m, fb, _ = own_registry
    with pytest.raises(edgeplug.UnknownBackendError):  # the process's registry does not know it
        edgeplug.get_backend(fb.FUSED)
    b = edgeplug.get_backend(fb.FUSED, registry=m)
    torch.manual_seed(0)
    model, x = _NormLinear().eval(), (torch.randn(2, 8),)
    quantized = edgeplug.quantize(model, x, b, "8a8w")
    assert quantized.quantization.backend == fb.FUSED and quantized.quantization.scheme == "8a8w"
    result = edgeplug.lower(quantized, x, b, verify=True)
    v = result.report.verification
    assert v is not None and v.passed, v.failures()
    assert result.report.quantization is not None and result.report.quantization.scheme == "8a8w"
    # the name alone is read in the process's registry, which does not know it
    with pytest.raises(edgeplug.UnknownBackendError):
        edgeplug.quantize(model, x, fb.FUSED, "8a8w")


def test_one_lowering_calls_the_partitioner_factory_once(own_registry):
    m, fb, calls = own_registry
    b = edgeplug.get_backend(fb.FUSED, registry=m)
    torch.manual_seed(0)
    result = edgeplug.lower(_NormLinear().eval(), (torch.randn(2, 8),), b, verify=True)
    assert [r.outcome for r in result.report.fusions] == ["fused"]  # the veto was asked, and said yes
    assert result.report.verification.passed
    assert calls == ["partitioner"]
    calls.clear()
    from executorch.exir import to_edge

    edge = to_edge(torch.export.export(_NormLinear().eval(), (torch.randn(2, 8),))).exported_program()
    _, records = edgeplug.fuse(edge, b)  # fuse alone makes its own partitioner for the veto, once
    assert [r.outcome for r in records] == ["fused"] and calls == ["partitioner"]


def test_the_trial_partition_of_shared_constants_reuses_the_lowerings_partitioner(own_registry):
    """BackendSpec.copy_shared_constants partitions once more at the end of the edge stage: with the same
    executorch partitioner (before, a second factory call, and a third with the veto)."""
    m, fb, calls = own_registry

    def edgeplug_backends():
        yield edgeplug.BackendSpec(
            backend="fixture-shared", description="fixture-fused, copying shared constants (an edgeplug test backend)",
            backend_id=fb.BACKEND_IDS[fb.FUSED], partitioner=fb.fused_partitioner, support_check=fb.fused_support_check,
            copy_shared_constants=True,
        )

    m.register(types.SimpleNamespace(edgeplug_backends=edgeplug.hookimpl(edgeplug_backends)), "fixture-shared-own")
    b = edgeplug.get_backend("fixture-shared", registry=m)
    assert b.spec.copy_shared_constants
    edgeplug.lower(_NormLinear().eval(), (torch.randn(2, 8),), b, dry_run=True)
    assert calls == ["partitioner"]


def test_the_flags_are_checked_once_with_one_error_class(own_registry):
    m, fb, calls = own_registry
    b = edgeplug.get_backend(fb.FUSED, registry=m)
    model, x = _NormLinear().eval(), (torch.randn(2, 8),)
    for call, says in (
        (lambda: edgeplug.lower(model, x, b, verify=True, verify_steps=0), "verify_steps must be a whole number >= 1"),
        (lambda: edgeplug.lower(model, x, b, verify_steps=2), "pass verify=True as well"),
        (lambda: edgeplug.lower(model, x, b, verify=True, tolerance=-1.0), "tolerance must be a finite number"),
    ):
        with pytest.raises(edgeplug.EdgeplugError, match=says) as err:
            call()
        assert type(err.value) is edgeplug.EdgeplugError
    assert calls == []  # refused before the partitioner was built
    lowered = edgeplug.lower(model, x, b)
    with pytest.raises(edgeplug.EdgeplugError, match="verify_steps must be a whole number >= 1") as err:
        edgeplug.verify(lowered, b, verify_steps=True)
    assert type(err.value) is edgeplug.EdgeplugError  # the same class lower raises for it


def test_the_command_line_refuses_verify_steps_where_lower_does(cli, fixture_backends, tmp_path, monkeypatch):
    """--verify-steps is checked once, by what lower checks it with, before the model file runs."""
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("lower", "mlp", "--backend", fixture_backends.FUSED, "--verify-steps", "0")
    assert code != 0 and "verify_steps must be a whole number >= 1 (tokens to generate), not 0" in err, err
    assert not list(tmp_path.iterdir())
