"""Backend: everything the installed plugins contribute to one backend."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from edgeplug.errors import BackendUnavailableError, UnknownBackendError
from edgeplug.plugins import PluginInfo, manager
from edgeplug.records import (
    Availability,
    BackendSpec,
    FusionPolicy,
    Kernel,
    PartitionerFilter,
    PassSpec,
)


@dataclass(frozen=True)
class Backend:
    """One backend's contributions, resolved across all plugins."""

    spec: BackendSpec
    plugin: PluginInfo
    skip_ops: tuple[Any, ...] = ()
    filters: tuple[PartitionerFilter, ...] = ()
    fusion_policies: tuple[FusionPolicy, ...] = ()
    kernels: tuple[Kernel, ...] = ()
    passes: tuple[PassSpec, ...] = ()
    #: which plugin contributed each pass/filter/kernel (for error messages)
    origins: dict[int, PluginInfo] = field(default_factory=dict, compare=False, hash=False)

    @property
    def name(self) -> str:
        return self.spec.backend

    @property
    def distribution(self) -> str:
        return self.plugin.distribution

    @property
    def version(self) -> str:
        return self.plugin.version

    def availability(self) -> Availability:
        try:
            result = self.spec.availability()
        except Exception as exc:  # an availability probe must never crash listing
            return Availability(ok=False, reason=f"availability check raised {exc!r}")
        if isinstance(result, Availability):
            return result
        return Availability(ok=bool(result))

    def require_available(self) -> None:
        a = self.availability()
        if not a.ok:
            msg = f"backend {self.name!r} cannot serialize its delegate here: {a.reason}"
            if a.hint:
                msg += f". {a.hint}"
            msg += ". Use --dry-run (or lower(..., dry_run=True)) to partition and report without a .pte."
            raise BackendUnavailableError(msg)

    def make_partitioner(self) -> Any:
        return self.spec.partitioner()

    def passes_for(self, stage: str) -> list[PassSpec]:
        return sorted((p for p in self.passes if p.stage == stage), key=lambda p: p.order)

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
        return self.origins.get(id(record))


def _is_named(info: PluginInfo, backend: str) -> bool:
    return backend in (info.name.lower(), info.distribution.lower().removeprefix("edgeplug-"))


def backends() -> list[str]:
    """Names of installed, loadable backends, sorted."""
    return sorted(manager().backend_specs())


def get_backend(name: str) -> Backend:
    """Resolve one backend's contributions across every loaded plugin."""
    m = manager()
    specs = m.backend_specs()
    key = name.strip().lower()
    if key not in specs:
        msg = f"no backend named {name!r}"
        broken = m.problems()
        if broken:
            msg += "; some plugins failed to load: " + " | ".join(p.message for p in broken)
        skipped = m.skipped()
        if skipped:
            msg += "; not loaded: " + ", ".join(
                f"plugin {i.name!r} ({i.distribution}, {why})" for i, why in skipped
            )
        installed = ", ".join(sorted(specs)) or "none"
        msg += f". Installed backends: {installed}."
        if not any(_is_named(i, key) for i, _ in skipped):
            msg += f" Install one with `pip install edgeplug-{key}`."
        raise UnknownBackendError(msg)
    info, spec = specs[key]
    origins: dict[int, PluginInfo] = {}

    def gather(hook: str) -> list[Any]:
        out = []
        for i, rec in m.records(hook, key):
            origins[id(rec)] = i
            out.append(rec)
        return out

    skip: list[Any] = []
    for rec in gather("edgeplug_skip_decomp"):
        for op in rec.ops:
            if op not in skip:
                skip.append(op)
    return Backend(
        spec=spec,
        plugin=info,
        skip_ops=tuple(skip),
        filters=tuple(gather("edgeplug_partitioner_filters")),
        fusion_policies=tuple(gather("edgeplug_fusion_policies")),
        kernels=tuple(gather("edgeplug_kernels")),
        passes=tuple(gather("edgeplug_passes")),
        origins=origins,
    )


__all__ = ["Backend", "backends", "get_backend", "BackendUnavailableError"]
