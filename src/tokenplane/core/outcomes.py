"""Outcomes of attempts and of requests, and the rule that every admitted request ends exactly once.

* :class:`AttemptResult` / :class:`AttemptOutcome`: what one upstream attempt did, as the shell
  observed it (sent into a retry plan, fed to breakers).
* :class:`TerminalOutcome` / :class:`Outcome`: how a request ended. Every request the gateway or the
  twin accepts reaches exactly one of COMPLETED, REJECTED, SHED, EXPIRED, FAILED, CANCELLED.
* :class:`OutcomeLedger`: a small bookkeeping aid for shells and tests that enforces "exactly one":
  ``open`` a request when it is offered, ``settle`` it once; a second ``settle`` is refused (returns
  ``False``) and counted in ``duplicates``, so a double-finish is visible rather than silently
  double-counted. Cost: one dict entry per open request.
"""

from __future__ import annotations

from collections import Counter
from enum import StrEnum

import msgspec

from tokenplane.core.views import InstanceId


class AttemptResult(StrEnum):
    OK = "ok"
    FAILED_BEFORE_FIRST_BYTE = "failed_before_first_byte"
    FAILED_MID_STREAM = "failed_mid_stream"
    TIMEOUT = "timeout"
    # The twin's client gave up on the attempt (its own timeout, or a broken stream it will not
    # splice) and re-sends the request from scratch: what it had received does not count.
    CLIENT_RESTART = "client_restart"


class AttemptOutcome(msgspec.Struct, frozen=True):
    """One attempt's result, reported by the shell.

    ``tokens_delivered`` counts output tokens this attempt delivered to the client (for a continuation,
    only the new ones). ``latency_s`` is the attempt's time to first token when it had one.
    """

    result: AttemptResult
    instance_id: InstanceId | None = None
    tokens_delivered: int = 0
    at_s: float = 0.0
    latency_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.result is AttemptResult.OK


class TerminalOutcome(StrEnum):
    COMPLETED = "completed"
    REJECTED = "rejected"
    SHED = "shed"
    EXPIRED = "expired"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Outcome(msgspec.Struct, frozen=True):
    """How one request ended; ``reason`` is the deciding policy's reason value (a stable string)."""

    request_id: str
    terminal: TerminalOutcome
    reason: str
    at_s: float
    attempts: int = 0
    tokens_delivered: int = 0


class OutcomeLedger:
    """Tracks open requests and settles each exactly once."""

    def __init__(self) -> None:
        self._open: set[str] = set()
        self._settled: set[str] = set()
        self.counts: Counter[TerminalOutcome] = Counter()
        self.duplicates = 0

    def open(self, request_id: str) -> bool:
        """Start tracking; ``False`` when the id is already open or settled."""
        if request_id in self._open or request_id in self._settled:
            self.duplicates += 1
            return False
        self._open.add(request_id)
        return True

    def settle(self, request_id: str, terminal: TerminalOutcome) -> bool:
        """Record the request's one terminal outcome; ``False`` (and counted) if not open."""
        if request_id not in self._open:
            self.duplicates += 1
            return False
        self._open.remove(request_id)
        self._settled.add(request_id)
        self.counts[terminal] += 1
        return True

    @property
    def pending(self) -> frozenset[str]:
        return frozenset(self._open)

    def is_settled(self, request_id: str) -> bool:
        return request_id in self._settled
