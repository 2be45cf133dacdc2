"""What the registry knows about each plugin and what went wrong with it: plain records, no loading."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from edgeplug._records import PassSpec

ENTRY_POINT_GROUP = "edgeplug"
ENV_DISABLE = "EDGEPLUG_DISABLE_PLUGINS"
ENV_ALLOW = "EDGEPLUG_PLUGINS"
#: ``MODULE[:OBJECT],...``: plugins without an entry point, registered in every process that reads it
ENV_REGISTER = "EDGEPLUG_REGISTER_PLUGINS"
REGISTERED = "<registered>"
#: the distribution of a plugin named in ``ENV_REGISTER``
NAMED_IN_ENV = f"<{ENV_REGISTER}>"


class PluginWarning(UserWarning):
    """Issued once per load for each plugin that was dropped (see ``problems()``)."""


@dataclass(frozen=True)
class PluginInfo:
    """Where a plugin came from."""

    name: str
    distribution: str
    version: str
    entry_point: str  # "name = module:attr", or "<register()>"

    @property
    def registered(self) -> bool:
        """True for a plugin added with ``register()`` or named in ``ENV_REGISTER``, not by an entry point."""
        return self.distribution in (REGISTERED, NAMED_IN_ENV)

    @property
    def named_in_env(self) -> bool:
        """True for a plugin named in ``ENV_REGISTER`` (``info.entry_point`` is its entry there)."""
        return self.distribution == NAMED_IN_ENV

    def describe(self) -> str:
        if self.named_in_env:
            return f"plugin {self.name!r} (named in {ENV_REGISTER})"
        if self.registered:
            return f"plugin {self.name!r} (registered with edgeplug.register_plugin())"
        return (
            f"plugin {self.name!r} (entry point '{self.entry_point}', "
            f"distribution {self.distribution} {self.version})"
        )


@dataclass(frozen=True)
class PluginProblem:
    """A plugin that was dropped, and why."""

    plugin: PluginInfo
    stage: str  # "import", "hook edgeplug_backends", ...
    cause: str

    @property
    def message(self) -> str:
        if self.plugin.named_in_env:
            remedy = f"take it out of {ENV_REGISTER}"
        elif self.plugin.registered:
            remedy = f"unregister it with edgeplug.unregister_plugin({self.plugin.name!r})"
        else:
            remedy = f"uninstall {self.plugin.distribution}"
        return (
            f"{self.plugin.describe()} failed at {self.stage}: {self.cause}. "
            f"Its backends are unavailable; the others still work. To silence this, "
            f"disable it with {ENV_DISABLE}={self.plugin.name} or {remedy}."
        )

    def __str__(self) -> str:
        return self.message


class Contribution(NamedTuple):
    """One record and the plugin that yielded it."""

    plugin: PluginInfo
    record: Any


def who(info: PluginInfo) -> str:
    if info.named_in_env:
        return f"plugin {info.name!r} (named in {ENV_REGISTER})"
    if info.registered:
        return f"plugin {info.name!r} (registered in code)"
    return f"distribution {info.distribution} (plugin {info.name!r})"


@dataclass(frozen=True)
class BackendProblem:
    """A backend made unavailable because contributions to it contradict each other."""

    backend: str
    cause: str
    plugins: tuple[PluginInfo, ...]

    @property
    def message(self) -> str:
        return (
            f"backend {self.backend!r} is unavailable: {self.cause}. To use it, {self.fix}. "
            "Every other backend keeps working."
        )

    @property
    def fix(self) -> str:
        """What takes the newcomer, and only it, out: a disable name that blocks none of the others."""
        blame = self.newcomer
        if blame.named_in_env:
            return f"take {blame.name!r} out of {ENV_REGISTER}"
        if blame.registered:
            return f"unregister {who(blame)} with edgeplug.unregister_plugin({blame.name!r})"
        others = {normalize_name(n) for p in self.plugins if p != blame for n in (p.name, p.distribution)}
        key = next((n for n in (blame.name, blame.distribution) if normalize_name(n) not in others), None)
        if key is None:  # its names are the others' too: disabling it would disable them
            return f"uninstall {blame.distribution} (the newcomer)"
        return f"uninstall one, or disable the newcomer with {ENV_DISABLE}={key} ({who(blame)})"

    @property
    def newcomer(self) -> PluginInfo:
        """The plugin to take out: not the backend's owner, else the last loaded.

        An installed plugin named after the backend (``edgeplug-vulkan`` for ``vulkan``, by entry point or
        distribution) owns it; a clone or add-on that contradicts it, installed or registered in code or
        through ``EDGEPLUG_REGISTER_PLUGINS``, is the one a user just added, whatever its name sorts as.
        """
        norm = normalize_name(self.backend)

        def owns(p: PluginInfo) -> bool:
            named = norm in (normalize_name(p.name), normalize_name(p.distribution).removeprefix("edgeplug-"))
            return named and not p.registered

        ranked = [p for p in self.plugins if not owns(p)] or list(self.plugins)
        return ranked[-1]

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class UnclaimedRecord:
    """A record naming a backend that no loaded plugin registers (it is ignored)."""

    contribution: Contribution
    registered: tuple[str, ...]

    @property
    def message(self) -> str:
        info, rec = self.contribution
        close = difflib.get_close_matches(rec.backend, self.registered, n=1)
        hint = f"Did you mean {close[0]!r}? " if close else ""
        return (
            f"{info.describe()} yields a {type(rec).__name__} for backend {rec.backend!r}, which no "
            f"loaded plugin registers (registered: {', '.join(self.registered) or 'none'}); it is "
            f"ignored. {hint}Fix the backend name in the plugin, or install the plugin that "
            f"registers {rec.backend!r}."
        )

    def __str__(self) -> str:
        return self.message


@dataclass
class Loaded:
    """What one load found: the plugins, their records, and every problem, before and after validation."""

    contributions: list[Contribution] = field(default_factory=list)
    problems: list[PluginProblem] = field(default_factory=list)
    plugins: list[PluginInfo] = field(default_factory=list)
    skipped: list[tuple[PluginInfo, str]] = field(default_factory=list)
    conflicts: dict[str, BackendProblem] = field(default_factory=dict)
    unclaimed: list[UnclaimedRecord] = field(default_factory=list)
    #: backend name -> its passes in run order
    pass_order: dict[str, tuple[PassSpec, ...]] = field(default_factory=dict)
    #: loaded plugin -> (the plugin API it was written for, the old spellings it uses: ``edgeplug._api.Rename``)
    api: dict[PluginInfo, tuple[int, list[Any]]] = field(default_factory=dict)
    #: a plugin imported before its records are collected (named in ``ENV_REGISTER``) -> the old spellings its
    #: import used (``edgeplug._api.Usage``), which the collection goes on noting
    imported: dict[PluginInfo, Any] = field(default_factory=dict)


def normalize_name(name: str) -> str:
    # PEP 503: distribution names compare case-insensitively, with runs of
    # '-', '_' and '.' equivalent; plugin names follow the same rule here.
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def name_set(value: Optional[str]) -> Optional[set[str]]:
    if value is None or not value.strip():
        return None  # set but empty (EDGEPLUG_PLUGINS=) means unset, not "allow nothing"
    return {normalize_name(v) for v in value.split(",") if v.strip()}
