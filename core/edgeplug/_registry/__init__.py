"""The plugin registry: discovery, blocking, validation, conflicts, pass ordering.

Plugins are found through entry points of group ``edgeplug`` (and modules
registered with ``register``). Nothing loads at ``import edgeplug``; the first
query of a ``PluginManager`` loads them once and caches the result, until
``reset()`` or a change of the three environment variables:

- ``EDGEPLUG_DISABLE_PLUGINS``: comma-separated plugin (entry point) or
  distribution names never to load (registered plugins included);
- ``EDGEPLUG_PLUGINS``: if set, only these entry-point plugins load (plugins
  registered with ``register`` are explicit and always load unless blocked).
- ``EDGEPLUG_REGISTER_PLUGINS``: comma-separated ``MODULE`` or ``MODULE:OBJECT``
  entries, each imported and registered as ``register`` would, in every process
  that has the variable (a zoo cell's process, a Ray worker): plugins that have
  no distribution, such as a test's backends. One that cannot be imported is
  reported like a plugin that fails to import.

Names compare case-insensitively with ``-``, ``_`` and ``.`` equivalent, as
distribution names do (``edgeplug_qnn`` blocks ``edgeplug-qnn``).

A plugin that fails to import, whose hook raises (the message keeps the
file and line), that returns an invalid record, or that has an ``edgeplug_*``
function without ``@edgeplug.hookimpl`` is dropped whole and reported
(``problems()``) with its entry point, distribution and how to disable it;
every other plugin keeps working.

Records are kept with the plugin that yielded them (``Contribution``) and
looked up by record type. Contributions that contradict each other make only
the contested backend unavailable (``conflicts()``; ``get_backend`` raises
``PluginConflictError`` naming both distributions): two backends of one name,
two kernels for one op and device, two fusion policies for one pattern, two
passes of one name, pass constraints naming no pass or forming a cycle.
A record for a backend no loaded plugin registers is ignored and reported
(``unclaimed()``), with the nearest registered name.

The modules, bottom up: ``info`` (the records of a load), ``loading``
(discovery and collection), ``ordering`` (pass run order), ``validation``
(conflicts), ``manager`` (``PluginManager``). This package is the only code
that talks to pluggy. It holds no process-wide state: the default manager
is in ``edgeplug._registry.lookup``.
"""

from edgeplug._registry.info import (
    ENTRY_POINT_GROUP,
    ENV_ALLOW,
    ENV_DISABLE,
    ENV_REGISTER,
    BackendProblem,
    Contribution,
    PluginInfo,
    PluginProblem,
    PluginWarning,
    UnclaimedRecord,
)
from edgeplug._plugin_code import plugin_location
from edgeplug._registry.loading import ENV_HOOK_SECONDS, TimeLimit, failure, time_limit
from edgeplug._registry.manager import PluginManager, PluginSummary, describe_record, summaries
from edgeplug._registry.ordering import order_passes

__all__ = [
    "BackendProblem",
    "Contribution",
    "ENTRY_POINT_GROUP",
    "ENV_ALLOW",
    "ENV_DISABLE",
    "ENV_HOOK_SECONDS",
    "ENV_REGISTER",
    "PluginInfo",
    "PluginManager",
    "PluginProblem",
    "PluginSummary",
    "PluginWarning",
    "TimeLimit",
    "UnclaimedRecord",
    "describe_record",
    "failure",
    "order_passes",
    "plugin_location",
    "summaries",
    "time_limit",
]
