"""Errors raised by the core.

Hierarchy::

    CoreError
    ├── InvalidPolicyConfig        a plugin's {kind, name, params} cannot be built (also a ValueError)
    │   └── PluginFamilyMismatch   a factory built something that is not of the family asked for
    └── InvalidCostInput           a price, throughput or token count that cannot be costed
                                   (also a ValueError)

Expected outcomes (a request refused, no instance available, a retry budget spent) are values with
a reason, not exceptions. Policy constructors called directly (not through the registry) reject
impossible arguments with a plain ``ValueError``; the registry turns those into
:class:`InvalidPolicyConfig` naming the plugin.
"""


class CoreError(Exception):
    """Base of every error the core raises."""


class InvalidPolicyConfig(CoreError, ValueError):
    """A plugin config names an unknown plugin or carries params its factory rejects."""


class PluginFamilyMismatch(InvalidPolicyConfig):
    """A registered factory built an object that does not implement its family's protocol."""


class InvalidCostInput(CoreError, ValueError):
    """A price, a throughput or a token count that cannot be costed (negative, zero rate, nan)."""
