"""QNN's PT2E quantizers: executorch's ``QnnQuantizer`` for the HTP, one per scheme."""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

from edgeplug_qnn.support import DEFAULT_SOC, SDK_VAR, SOC_VAR

_env_lock = threading.Lock()


@contextlib.contextmanager
def sdk_left_to_caller() -> Iterator[None]:
    """Keep executorch from downloading the QNN SDK while a quantizer is built.

    With ``QNN_SDK_ROOT`` unset, building a ``QnnQuantizer`` looks for the
    SDK's op-constraint tables and, not finding them, downloads the SDK and
    libc++ (a URLError traceback offline). Set to the empty string, the
    variable tells executorch the caller supplies the SDK, and the quantizer
    falls back to annotating without the SDK's constraint checks. A value
    the user set is left alone; the variable is restored on exit.
    """
    with _env_lock:
        if os.environ.get(SDK_VAR) is not None:
            yield
            return
        os.environ[SDK_VAR] = ""
        try:
            yield
        finally:
            os.environ.pop(SDK_VAR, None)


def qnn_quantizer(quant_dtype: str):
    """``QnnQuantizer`` for the configured SoC (EDGEPLUG_QNN_SOC), per-channel linear and conv weights."""
    with sdk_left_to_caller():
        from edgeplug_qnn._executorch import ensure_qualcomm_importable

        ensure_qualcomm_importable()  # 1.4 downloads the QNN SDK at import: not here
        from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
        from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset

        soc = getattr(QcomChipset, os.environ.get(SOC_VAR, DEFAULT_SOC).upper())
        quantizer = QnnQuantizer(soc_model=soc)
    quantizer.set_default_quant_config(
        getattr(QuantDtype, f"use_{quant_dtype}"), is_conv_per_channel=True, is_linear_per_channel=True
    )
    return quantizer
