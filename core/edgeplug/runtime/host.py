"""The previous plugin API's path ``edgeplug.runtime.host`` (``edgeplug._api.RENAMES``): each name resolves to its new home,
with a ``PluginApiDeprecationWarning`` naming it, until the rename is removed."""

from edgeplug._api import old_path

__getattr__, __dir__ = old_path(__name__)
