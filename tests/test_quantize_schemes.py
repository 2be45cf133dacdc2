"""The quantizer hook: each backend's schemes, built from executorch's own quantizers, offline."""

from __future__ import annotations

import socket
import types

import pytest

import edgeplug
from edgeplug._errors import EdgeplugError
from edgeplug._quantization import QuantizationError, make_quantizer, quant_scheme, schemes

#: backend -> PT2E scheme -> (activation bits, weight bits, per channel); torchao source transforms
#: (xnnpack 8da4w, e4, ...; vulkan w4-g32) are tested with their plugins
EXPECTED = {
    "qnn": {"8a8w": (8, 8, True), "16a8w": (16, 8, True), "8a4w": (8, 4, True), "16a4w": (16, 4, True)},
    "samsung": {"a8w8": (8, 8, True)},
    "xnnpack": {"8a8w": (8, 8, True)},
    "vulkan": {"w8": (None, 8, True), "w4": (None, 4, True)},
    "webgpu": {"w8": (None, 8, True), "w4": (None, 4, True)},
}
ALL = [(b, s) for b, table in EXPECTED.items() for s in table]


def test_every_backend_declares_its_schemes():
    for backend, table in EXPECTED.items():
        got = {s.scheme: (s.activation_bits, s.weight_bits, s.per_channel) for s in schemes(backend) if s.kind == "pt2e"}
        assert got == table, backend
        assert all(s.backend == backend and s.description for s in schemes(backend))


@pytest.fixture
def no_network(monkeypatch):
    """Every connection or name lookup is refused and recorded; QNN_SDK_ROOT is unset."""
    attempts: list[str] = []

    def refuse(*args, **kwargs):
        attempts.append(repr(args[1:] or args)[:120])
        raise OSError("networking is disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    # executorch sets up the SDK once per process: make this test see the first time
    from executorch.backends.qualcomm.utils import qnn_sdk_setup

    monkeypatch.setattr(qnn_sdk_setup, "_sdk_ready", False)
    return attempts


def _quantizer_class(backend: str) -> type:
    if backend == "qnn":
        from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer

        return QnnQuantizer
    if backend == "samsung":
        from executorch.backends.samsung.quantizer import EnnQuantizer

        return EnnQuantizer
    if backend == "xnnpack":
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer

        return XNNPACKQuantizer
    from executorch.backends.vulkan.quantizer.vulkan_quantizer import VulkanQuantizer

    return VulkanQuantizer


@pytest.mark.parametrize("backend,scheme", ALL)
def test_factory_builds_the_backends_own_quantizer_without_the_network(backend, scheme, no_network):
    import os

    import torch

    quantizer = make_quantizer(backend, scheme)
    assert type(quantizer) is _quantizer_class(backend)
    assert no_network == [], f"building {backend} {scheme} tried to reach the network: {no_network}"
    assert "QNN_SDK_ROOT" not in os.environ  # the variable is restored, not left empty
    act, weight, _ = EXPECTED[backend][scheme]
    if backend == "qnn":
        from executorch.backends.qualcomm.quantizer.quantizer import QuantDtype

        config = quantizer.default_quant_config
        assert config.quant_dtype == getattr(QuantDtype, f"use_{scheme}")
        assert config.is_linear_per_channel and config.is_conv_per_channel
    elif backend == "xnnpack":
        config = quantizer.global_config
        assert config.weight.qscheme == torch.per_channel_symmetric
        assert config.input_activation.dtype == torch.int8
    elif backend in ("vulkan", "webgpu"):
        config = quantizer.global_config
        assert config.input_activation is None and config.output_activation is None  # weight-only
        assert config.weight.quant_max == 2 ** (weight - 1) - 1
    else:
        from executorch.backends.samsung.quantizer import Precision

        assert quantizer._precision == Precision.A8W8 and quantizer._is_per_channel


def test_a_qnn_sdk_root_the_user_set_is_left_alone(monkeypatch, tmp_path):
    import os

    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path))
    make_quantizer("qnn", "8a8w")
    assert os.environ["QNN_SDK_ROOT"] == str(tmp_path)


def test_unknown_scheme_names_the_schemes_the_backend_has():
    with pytest.raises(QuantizationError) as err:
        quant_scheme("qnn", "8a16w")
    msg = str(err.value)
    assert "backend 'qnn' has no quantization scheme '8a16w'" in msg
    for scheme in EXPECTED["qnn"]:
        assert scheme in msg
    with pytest.raises(QuantizationError, match=r"no quantization scheme 'w3'.*w8 \(weight-only"):
        quant_scheme("vulkan", "w3")
    assert quant_scheme("vulkan", " W4 ").weight_bits == 4  # names are normalised


def _plain_backend(name: str) -> types.SimpleNamespace:
    def edgeplug_backends():
        yield edgeplug.BackendSpec(backend=name, description="no quantizer", backend_id="XnnpackBackend", partitioner=list)

    return types.SimpleNamespace(edgeplug_backends=edgeplug.hookimpl(edgeplug_backends))


def test_backend_without_a_quantizer_says_so_and_names_those_with_one(edgeplug_register):
    import torch

    edgeplug_register(_plain_backend("plaincpu"), name="plaincpu-plugin")
    with pytest.raises(QuantizationError) as err:
        edgeplug.quantize(torch.nn.Linear(4, 4), (torch.ones(1, 4),), "plaincpu", "8a8w")
    msg = str(err.value)
    assert "backend 'plaincpu' has no quantizer" in msg and "edgeplug_quantizers" in msg
    assert "qnn" in msg and "xnnpack" in msg


def test_two_schemes_of_one_name_for_one_backend_are_a_conflict(edgeplug_register):
    def edgeplug_quantizers():
        yield edgeplug.QuantScheme(
            backend="vulkan", scheme="w8", factory=list, activation_bits=None, weight_bits=8,
            per_channel=False, description="a second w8",
        )

    edgeplug_register(types.SimpleNamespace(edgeplug_quantizers=edgeplug.hookimpl(edgeplug_quantizers)), name="w8-again")
    # the plugin manager makes the contested backend unavailable, naming both contributors
    with pytest.raises(EdgeplugError, match=r"two quantization schemes named 'w8' .*backend 'vulkan'.*edgeplug-vulkan.*w8-again"):
        make_quantizer("vulkan", "w8")
    assert quant_scheme("webgpu", "w8").weight_bits == 8  # every other backend keeps working


def test_scheme_records_validate_their_names():
    from pydantic import ValidationError

    rec = edgeplug.QuantScheme(
        backend="X", scheme=" 8A8W ", factory=list, activation_bits=8, weight_bits=8, per_channel=True, description="d"
    )
    assert (rec.backend, rec.scheme) == ("x", "8a8w")
    with pytest.raises(ValidationError, match="scheme name '8 bit' must be lower-case"):
        edgeplug.QuantScheme(
            backend="x", scheme="8 bit", factory=list, activation_bits=8, weight_bits=8, per_channel=True, description="d"
        )
