"""Priority classes: interactive, standard and batch, as ``RequestInfo.priority`` carries them.

The admission queue serves them in strict priority (with optional aging), the shedder and the
up-front TTFT rule act per class; :class:`PriorityClass` is the one vocabulary they share.
"""

from __future__ import annotations

from enum import IntEnum

from tokenplane.core.errors import InvalidPolicyConfig


class PriorityClass(IntEnum):
    """Higher is more urgent; values match ``RequestInfo.priority`` as the gateway sets it."""

    BATCH = -1
    STANDARD = 0
    INTERACTIVE = 1

    @classmethod
    def from_name(cls, name: str) -> PriorityClass:
        try:
            return cls[name.strip().upper()]
        except KeyError:
            known = ", ".join(c.name.lower() for c in cls)
            raise InvalidPolicyConfig(f"unknown priority class {name!r}; known: {known}") from None

    @classmethod
    def from_value(cls, value: int) -> PriorityClass:
        """Clamp any integer priority onto the three classes."""
        return _PRIORITY_BY_VALUE[max(-1, min(1, value))]

    @property
    def label(self) -> str:
        return self.name.lower()


_PRIORITY_BY_VALUE: dict[int, PriorityClass] = {c.value: c for c in PriorityClass}  # cls(v) is slower
