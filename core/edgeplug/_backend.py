"""Backend: everything the loaded plugins contribute to one backend, resolved from a ``PluginManager``.

The lookup by name is ``edgeplug._registry.lookup.get_backend`` (the process's registry, or one passed in);
the functions here take the registry they read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar

from edgeplug._errors import BackendUnavailableError
from edgeplug._registry import Contribution, PluginInfo, PluginManager
from edgeplug._records import (
    Availability,
    BackendSpec,
    FusionPolicy,
    Kernel,
    PartitionerFilter,
    PassSpec,
)

R = TypeVar("R")

#: Backends with a first-party plugin: only these get a `pip install` hint.
FIRST_PARTY = ("coreml", "qnn", "samsung", "vulkan", "webgpu", "xnnpack")
#: how to get a backend at all (the CLI says it too: the one place these names are spelled)
INSTALL_HINT = (
    "pip install edgeplug-xnnpack (or -vulkan, -webgpu, -qnn, -samsung, -coreml); from a checkout of "
    "edgeplug: pip install ./ ./plugins/xnnpack"
)


@dataclass(frozen=True)
class Backend:
    """One backend's contributions, resolved across all plugins.

    Each record is kept with the plugin that yielded it (``contributions``,
    ``origin(record)``); the typed tuples below are views of them.
    """

    spec: BackendSpec
    plugin: PluginInfo
    #: Ops kept whole through ``to_edge`` (from every ``KeepWhole`` record, deduplicated).
    keep_whole: tuple[Any, ...] = ()
    filters: tuple[PartitionerFilter, ...] = ()
    fusion_policies: tuple[FusionPolicy, ...] = ()
    kernels: tuple[Kernel, ...] = ()
    #: Passes of every stage, in run order (``passes_for`` picks a stage).
    passes: tuple[PassSpec, ...] = ()
    #: Every record for this backend with the plugin that yielded it, in load order.
    contributions: tuple[Contribution, ...] = field(default=(), compare=False, hash=False)

    @property
    def name(self) -> str:
        return self.spec.backend

    @property
    def distribution(self) -> str:
        return self.plugin.distribution

    @property
    def version(self) -> str:
        return self.plugin.version

    def records(self, record_type: type[R]) -> tuple[R, ...]:
        """This backend's records of one type (any record type, e.g. a newer hook's)."""
        return tuple(c.record for c in self.contributions if isinstance(c.record, record_type))

    def availability(self) -> Availability:
        try:
            result: object = self.spec.availability()  # a plugin's probe may answer a bare bool
        except Exception as exc:  # an availability probe must never crash listing
            return Availability(
                ok=False,
                reason=f"its availability check (BackendSpec.availability, from {self.plugin.describe()}) raised "
                f"{type(exc).__name__}: {exc}",
            )
        if isinstance(result, Availability):
            return result
        return Availability(ok=bool(result))

    def require_available(self, dry_run: bool = False) -> None:
        """Refuse, before any work, a lowering this machine cannot do: a real one where the backend cannot
        serialize, any (dry runs too) where it cannot even partition (``Availability.dry_run`` False)."""
        a = self.availability()
        if a.ok or (dry_run and a.dry_run):
            return
        msg = f"backend {self.name!r} cannot {'partition' if not a.dry_run else 'serialize its delegate'} here: {a.reason}"
        if a.hint:
            msg += f". {a.hint}"
        if a.dry_run:
            msg += ". Use --dry-run (or lower(..., dry_run=True)) to partition and report without a .pte."
        else:
            msg += "; nothing was done (a dry run cannot partition without it either)"
        raise BackendUnavailableError(msg)

    def make_partitioner(self) -> Any:
        return self.spec.partitioner()

    def passes_for(self, stage: str) -> list[PassSpec]:
        """The passes of one stage in run order (before/after constraints, then ``order``)."""
        return [p for p in self.passes if p.stage == stage]

    def fusion_policy(self, pattern: str = "rms_norm") -> Optional[FusionPolicy]:
        for p in self.fusion_policies:
            if p.pattern == pattern:
                return p
        return None

    def kernel(self, op: str, device: Optional[str] = None) -> Optional[Kernel]:
        for k in self.kernels:
            if k.op == op and (device is None or k.device == device):
                return k
        return None

    def origin(self, record: Any) -> Optional[PluginInfo]:
        """The plugin that yielded ``record`` (the record itself, not an equal copy)."""
        for c in self.contributions:
            if c.record is record:
                return c.plugin
        return None


def given_backend(backend: Any, where: str) -> Backend:
    """``backend`` itself, a ``Backend`` the façade resolved; anything else is refused, naming the fix.

    Below the façade (``edgeplug.lower``, ``quantize``, ``verify``, ``fuse``, ``transform``, the CLI) a
    name is never looked up again: which registry it would be read from is the caller's choice, made once.
    """
    if isinstance(backend, Backend):
        return backend
    raise TypeError(
        f"{where} takes a Backend, not {type(backend).__name__} {backend!r}: resolve a name once with "
        "edgeplug.get_backend(name) (or get_backend(name, registry=...)), or call the edgeplug façade, which does"
    )


def backend_names(registry: PluginManager) -> list[str]:
    """Names of the loadable backends ``registry`` found, sorted."""
    return sorted(registry.backend_specs())


__all__ = ["Backend", "backend_names", "given_backend"]
