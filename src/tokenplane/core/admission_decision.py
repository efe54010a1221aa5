"""What the admission queue answers: the decision (:class:`Admission`: admit now, queued, or
rejected), its reason, the terminal outcome each refusal or removal means (:func:`terminal_for`),
and the queued item (:class:`QueuedRequest`) a queue hands back. The rules are in
:mod:`tokenplane.core.admission`'s docstring."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

import msgspec

from tokenplane.core.outcomes import TerminalOutcome
from tokenplane.core.priority import PriorityClass
from tokenplane.core.views import RequestInfo


class AdmissionDecision(StrEnum):
    ADMIT_NOW = "admit_now"
    QUEUED = "queued"
    REJECTED = "rejected"


class AdmissionReason(StrEnum):
    ADMITTED = "admitted"
    QUEUED_NO_CAPACITY = "queued_no_capacity"
    QUEUED_BEHIND = "queued_behind"
    QUEUED_TENANT_LIMIT = "queued_tenant_limit"
    QUEUED_RESERVED = "queued_reserved"
    QUEUE_FULL = "queue_full"
    TENANT_QUEUE_FULL = "tenant_queue_full"
    DEADLINE_UNREACHABLE = "deadline_unreachable"
    SHED_LOW_PRIORITY = "shed_low_priority"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


_TERMINAL: Mapping[AdmissionReason, TerminalOutcome] = {
    AdmissionReason.QUEUE_FULL: TerminalOutcome.REJECTED,
    AdmissionReason.TENANT_QUEUE_FULL: TerminalOutcome.REJECTED,
    AdmissionReason.DEADLINE_UNREACHABLE: TerminalOutcome.REJECTED,
    AdmissionReason.SHED_LOW_PRIORITY: TerminalOutcome.SHED,
    AdmissionReason.EXPIRED: TerminalOutcome.EXPIRED,
    AdmissionReason.CANCELLED: TerminalOutcome.CANCELLED,
}


def terminal_for(reason: AdmissionReason) -> TerminalOutcome | None:
    """The terminal outcome a refusal or removal means; ``None`` for admit/queue reasons."""
    return _TERMINAL.get(reason)


class QueuedRequest(msgspec.Struct, frozen=True):
    request: RequestInfo
    priority: PriorityClass
    deadline_s: float
    enqueued_s: float
    cost_tokens: int


class Admission(msgspec.Struct, frozen=True):
    decision: AdmissionDecision
    reason: AdmissionReason
    priority: PriorityClass
    deadline_s: float
    retry_after_s: float | None = None
    evicted: QueuedRequest | None = None

    @property
    def admitted(self) -> bool:
        return self.decision is AdmissionDecision.ADMIT_NOW

    @property
    def queued(self) -> bool:
        return self.decision is AdmissionDecision.QUEUED

    @property
    def rejected(self) -> bool:
        return self.decision is AdmissionDecision.REJECTED
