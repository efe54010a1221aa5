"""Errors of the shared-state backends.

Hierarchy::

    SharedStateError              a state backend could not be built or used
    └── BackendUnavailable        Redis did not answer (refused, reset, timed out, wrong reply)

The request path never sees these: a replica whose backend is unavailable goes on with its local
state (fail open) and says so in ``tokenplane_state_backend_up`` and the log.
"""

from __future__ import annotations


class SharedStateError(Exception):
    """A state backend could not be built or used."""


class BackendUnavailable(SharedStateError):
    """The shared backend did not answer in time, or answered something unexpected."""
