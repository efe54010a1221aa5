"""Errors of the live control loop.

Hierarchy::

    ControlError
    ├── ActuatorError            an actuator could not carry out start / stop / list
    │   ├── ScaleApiError        the Kubernetes API refused, or kept failing past the retries
    │   └── CommandFailed        the scale command exited non-zero, timed out or could not start
    └── AutoscalingConfigError   the ``autoscaling:`` section is invalid (also a ``ValueError``)

A decision that cannot be carried out is logged and the loop goes on: the next tick sees the fleet
as it is and decides again. Expected outcomes (an instance still warming, a drain not yet empty)
are states, never exceptions. A constructor handed an impossible argument (``interval_s <= 0``)
raises a plain ``ValueError``: a programming error, not a configuration one.
"""

from __future__ import annotations


class ControlError(Exception):
    """Base class of the control loop's errors."""


class ActuatorError(ControlError):
    """An actuator could not carry out an operation."""


class ScaleApiError(ActuatorError):
    """The Kubernetes API refused a scale read or patch, or failed past the configured retries."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class CommandFailed(ActuatorError):
    """The configured scale command failed (non-zero exit, timeout, or not runnable)."""

    def __init__(self, message: str, *, returncode: int | None = None, output: str = "") -> None:
        super().__init__(message)
        self.returncode = returncode
        self.output = output


class AutoscalingConfigError(ControlError, ValueError):
    """The ``autoscaling:`` configuration is invalid; the message names the field and the reason."""
