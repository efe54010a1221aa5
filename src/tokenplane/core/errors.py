"""Errors raised by the core.

Hierarchy::

    CoreError
    └── InvalidPolicyConfig   a plugin's {kind, name, params} cannot be built

Expected outcomes (a request refused, no instance available) are values with a reason, not
exceptions.
"""


class CoreError(Exception):
    """Base of every error the core raises."""


class InvalidPolicyConfig(CoreError, ValueError):
    """A plugin config names an unknown plugin or carries params its factory rejects."""
