"""A circuit breaker's states, the reasons it moves and the only legal moves between them
(:data:`LEGAL_TRANSITIONS`), and the :class:`BreakerEvent` a move reports.

:mod:`tokenplane.core.breaker` holds the board that makes the moves and documents when it does.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from tokenplane.core.views import InstanceId


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class BreakerReason(StrEnum):
    CONSECUTIVE_FAILURES = "consecutive_failures"
    ERROR_RATE = "error_rate"
    LATENCY_OUTLIER = "latency_outlier"
    COOLDOWN_ELAPSED = "cooldown_elapsed"
    PROBE_SUCCEEDED = "probe_succeeded"
    PROBE_FAILED = "probe_failed"
    PROBE_SLOW = "probe_slow"
    PEER_OPENED = "peer_opened"
    PEER_CLOSED = "peer_closed"


PEER_REASONS = frozenset((BreakerReason.PEER_OPENED, BreakerReason.PEER_CLOSED))
"""Transitions adopted from another gateway replica (:meth:`BreakerBoard.adopt`), not observed here."""


LEGAL_TRANSITIONS: frozenset[tuple[BreakerState, BreakerState]] = frozenset(
    {
        (BreakerState.CLOSED, BreakerState.OPEN),
        (BreakerState.OPEN, BreakerState.HALF_OPEN),
        (BreakerState.HALF_OPEN, BreakerState.CLOSED),
        (BreakerState.HALF_OPEN, BreakerState.OPEN),
    }
)


class BreakerEvent(msgspec.Struct, frozen=True):
    instance_id: InstanceId
    from_state: BreakerState
    to_state: BreakerState
    reason: BreakerReason
    at_s: float
