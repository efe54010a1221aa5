"""Per-minute request and token limits, and the decisions the quota stage acts on.

A limit holds over every sliding minute, not only over fixed ones. The window is cut into
:data:`SLOTS` slots (2 s each for a minute); what was used is the sum of the current slot and the
``SLOTS`` before it, kept as a running total with one number per slot (at most ``SLOTS + 1`` per
key, whatever the traffic). That span always covers the last whole window, so what is admitted
within any sliding window never passes the limit (the previous design, two fixed buckets weighted
by their overlap, let a burst at a bucket's start count as spread over it: up to twice the limit
in the window that began with the burst). The span is up to one slot longer than the window, so
under a steady overload a key gets ``SLOTS / (SLOTS + 1)`` of its limit per window (96.8 %).

A request is refused when its one request would take the requests used past ``rpm``, or when the
tokens used already reach ``tpm`` (a request's tokens are known only as it runs: its prompt is
charged when it is admitted, its completion when it ends, so the tokens of requests in flight may
pass the limit by what they are still generating).

:class:`LocalQuotas` keeps the slots in this process: it is the ``memory`` backend and the
fallback of the ``redis`` backend while Redis is unavailable (each replica then enforces the full
limits on its own, so the fleet may admit up to replicas × the limits until Redis answers again).
The Redis backend runs the same arithmetic in one Lua script
(:data:`~tokenplane.shared_state.scripts.ACQUIRE`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

WINDOW_S = 60.0
SLOTS = 30
"""Slots per window: a sliding minute is counted in 2 s slots."""
CONCURRENCY_RETRY_AFTER_S = 1.0


class QuotaReason(StrEnum):
    ADMITTED = "admitted"
    CONCURRENCY = "concurrency"
    TENANT_RPM = "tenant_rpm"
    TENANT_TPM = "tenant_tpm"
    KEY_RPM = "key_rpm"
    KEY_TPM = "key_tpm"


# The order the Redis script checks them in (its return code indexes this tuple).
CHECK_ORDER = (
    QuotaReason.CONCURRENCY,
    QuotaReason.TENANT_RPM,
    QuotaReason.TENANT_TPM,
    QuotaReason.KEY_RPM,
    QuotaReason.KEY_TPM,
)


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """A tenant's shared limits; 0 means no limit. ``concurrency`` is global only with Redis (the
    local bound is the tenant's own ``max_concurrency``, kept in :mod:`~tokenplane.gateway.tenants`)."""

    tenant: str
    concurrency: int = 0
    rpm: int = 0
    tpm: int = 0
    key_rpm: int = 0
    key_tpm: int = 0

    @property
    def rated(self) -> bool:
        return bool(self.rpm or self.tpm or self.key_rpm or self.key_tpm)


@dataclass(frozen=True, slots=True)
class QuotaDecision:
    admit: bool
    reason: QuotaReason
    retry_after_s: float = 0.0
    shared: bool = True
    """Whether the shared backend decided (False: local state, fail open or the memory backend)."""


ADMITTED = QuotaDecision(True, QuotaReason.ADMITTED)
ADMITTED_LOCALLY = QuotaDecision(True, QuotaReason.ADMITTED, shared=False)


class SlidingWindow:
    """One key's slots (see the module docstring): ``total`` is what the current slot and the
    ``SLOTS`` before it hold, after :meth:`roll` to the current slot."""

    __slots__ = ("last", "parts", "total")

    def __init__(self) -> None:
        self.last = -(SLOTS + 2)
        self.parts: dict[int, float] = {}
        self.total = 0.0

    def roll(self, cur: int) -> None:
        if cur <= self.last:
            return
        if cur - self.last > SLOTS:
            self.parts.clear()
            self.total = 0.0
        else:
            for i in range(self.last - SLOTS, cur - SLOTS):
                gone = self.parts.pop(i, None)
                if gone is not None:
                    self.total -= gone
        self.last = cur

    def add(self, cur: int, amount: float) -> None:
        self.parts[cur] = self.parts.get(cur, 0.0) + amount
        self.total += amount

    def wait(self, need: float, cur: int, now: float, slot_s: float) -> float:
        """Seconds until ``need`` of what is counted has left the span (a Retry-After)."""
        freed = 0.0
        for i in range(cur - SLOTS, cur + 1):
            freed += self.parts.get(i, 0.0)
            if freed >= need:
                return (i + SLOTS + 1) * slot_s - now
        return (cur + SLOTS + 1) * slot_s - now


class LocalQuotas:
    """Rate limits in this process (see the module docstring); ``now`` is wall-clock seconds."""

    def __init__(self, window_s: float = WINDOW_S, max_keys: int = 100_000) -> None:
        self.window_s = window_s
        self.slot_s = window_s / SLOTS
        self._windows: dict[str, SlidingWindow] = {}
        self._max_keys = max_keys

    def _get(self, key: str, cur: int) -> SlidingWindow:
        w = self._windows.get(key)
        if w is None:
            if len(self._windows) >= self._max_keys:
                self._windows.clear()  # bounded memory; forgetting only ever admits more
            w = self._windows[key] = SlidingWindow()
        w.roll(cur)
        return w

    def acquire(self, quota: TenantQuota, key_id: str, tokens: int, now: float) -> QuotaDecision:
        """Admit (charging one request and ``tokens``) or refuse with a reason and a wait."""
        cur = math.floor(now / self.slot_s)
        checks = (
            (QuotaReason.TENANT_RPM, "r:" + quota.tenant, quota.rpm, 1.0),
            (QuotaReason.TENANT_TPM, "t:" + quota.tenant, quota.tpm, 0.0),
            (QuotaReason.KEY_RPM, "kr:" + key_id, quota.key_rpm, 1.0),
            (QuotaReason.KEY_TPM, "kt:" + key_id, quota.key_tpm, 0.0),
        )
        for reason, key, limit, cost in checks:
            if not limit:
                continue
            w = self._get(key, cur)
            if (cost and w.total + cost > limit) or (not cost and w.total >= limit):
                need = w.total + cost - limit if cost else w.total - limit + 1
                wait = w.wait(need, cur, now, self.slot_s)
                return QuotaDecision(False, reason, max(1.0, wait), shared=False)
        for _, key, limit, cost in checks:
            if limit:
                self._get(key, cur).add(cur, cost or tokens)
        return ADMITTED_LOCALLY

    def charge(self, quota: TenantQuota, key_id: str, tokens: int, now: float) -> None:
        """Add a finished request's completion tokens to the token limits."""
        if tokens <= 0:
            return
        cur = math.floor(now / self.slot_s)
        if quota.tpm:
            self._get("t:" + quota.tenant, cur).add(cur, tokens)
        if quota.key_tpm:
            self._get("kt:" + key_id, cur).add(cur, tokens)
