"""Exceptions edgeplug raises. Each message says what, where, and what to do."""

from __future__ import annotations

from typing import Any, Optional


class EdgeplugError(Exception):
    """Base class of every error edgeplug raises on purpose."""

    #: set where a lowering fails: the stage that was running, and who is at fault (the CLI's line names both)
    lowering_stage: Optional[str]
    at_fault: Optional[str]


class PluginConflictError(EdgeplugError):
    """Two plugins contribute the same thing (a backend name, an op kernel)."""


class UnknownBackendError(EdgeplugError, KeyError):
    """No loadable backend has the name asked for (the message says why: not installed, a conflict, ...)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class BackendUnavailableError(EdgeplugError):
    """The backend's delegate cannot be serialized here (e.g. a missing SDK)."""


class PassError(EdgeplugError):
    """A backend pass failed or left a broken graph."""

    #: set by the pass runner: the pass, its stage, its backend and plugin, and the passes that ran before it
    pass_name: str
    stage: str
    backend: str
    plugin: Any
    passes_before: tuple[str, ...]


class LoweringError(EdgeplugError):
    """Lowering failed at a named stage."""


class KernelError(EdgeplugError):
    """A runtime kernel refused its inputs or could not run."""


class VerificationError(EdgeplugError):
    """Host verification could not run a lowered program."""


class RuntimeRefusedError(VerificationError):
    """executorch's runtime refused to load or run a lowered program (a kernel it does not link, ...)."""


class RuntimeNotFound(EdgeplugError):
    """A backend's own runtime (``BackendSpec.device_runtime``) is not on this machine; the message says how to get one."""


class OutputPathError(EdgeplugError):
    """An output path cannot be written (checked before any work)."""


class QuantizationError(EdgeplugError):
    """Quantizing a model failed, or was asked of a backend/scheme that cannot do it."""


class ExecutorchVersionError(EdgeplugError):
    """The installed ExecuTorch lacks a feature edgeplug or a backend needs (the message names the feature, what
    it is needed for, the release that has it, and the range edgeplug is tested with)."""
