"""Where a backend's programs run on this host, chosen once per verification: its own runtime
(``BackendSpec.device_runtime``) where it is found, else by ``BackendSpec.verify_method``, or nowhere, and why.

Light on purpose (no torch, no executorch until a "pte" backend without its runtime asks which delegates
ExecuTorch's Python runtime links): `edgeplug backends` says what `--verify` will do with the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from edgeplug import _executorch
from edgeplug._errors import RuntimeNotFound

if TYPE_CHECKING:  # its spec and name only
    from edgeplug._backend import Backend


def find_device_runtime(backend: Backend) -> tuple[Any, str]:
    """``backend``'s own runtime (``BackendSpec.device_runtime``) if one is on this machine, else None and
    why not (empty when the backend declares none)."""
    factory = backend.spec.device_runtime
    if factory is None:
        return None, ""
    try:
        return factory(), ""
    except RuntimeNotFound as exc:
        return None, str(exc)


@dataclass(frozen=True)
class Target:
    """How a backend's programs run here, chosen once per verification (``choose_target``): ``method`` "pte"
    when its own runtime (``runtime``) is found, else its ``BackendSpec.verify_method``; ``why_not`` says why
    its own runtime is not used (empty when it declares none)."""

    method: str
    runtime: Any = None
    why_not: str = ""


def choose_target(backend: Backend) -> Target:
    """Look the backend's own runtime up, once: where found, programs run in it; else by ``verify_method``.

    ``verify_method="pte"`` runs the ``.pte`` in ExecuTorch's Python runtime, which can only where that runtime
    links the backend's delegate (``backend_id``): where it does not, the target is "none" and ``why_not``
    says so, with the backend's own runtime's install hint where it declares one, instead of a run that ends in
    the runtime's error code."""
    runtime, why_not = find_device_runtime(backend)
    if runtime is not None:
        return Target("pte", runtime, why_not)
    method = backend.spec.verify_method
    if method == "pte":
        linked = _executorch.runtime_backends()
        if linked is not None and backend.spec.backend_id not in linked:
            return Target("none", None, _not_in_python_runtime(backend, linked, why_not))
    return Target(method, None, why_not)


def _not_in_python_runtime(backend: Backend, linked: frozenset[str], why_not: str) -> str:
    own = f"its own runtime (BackendSpec.device_runtime) is not found here: {why_not}" if why_not else (
        "it declares no runtime of its own (BackendSpec.device_runtime)"
    )
    return (
        "it verifies by running the .pte (verify_method 'pte'), but ExecuTorch's Python "
        f"runtime has no {backend.spec.backend_id} delegate (it links {', '.join(sorted(linked)) or 'none'}), and "
        f"{own}"
    )


def unrunnable(backend: Backend, target: Optional[Target] = None) -> str:
    """Why ``backend``'s programs cannot run on this host ('' where they can): what ``--verify`` is refused
    with, before any work, and what ``edgeplug backends`` says."""
    target = target or choose_target(backend)
    if target.method != "none":
        return ""
    if target.why_not and backend.spec.verify_method == "pte":
        return target.why_not
    return "its BackendSpec.verify_method is 'none' (no runtime for its programs on this host)"
