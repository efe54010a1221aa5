"""Per-minute request and token limits, and the decisions the quota stage acts on.

A limit is a sliding window of one minute approximated by two fixed one-minute buckets (the
method of Cloudflare's and Redis's rate limiters): at a point ``f`` of the way through the current
bucket, what was used is ``previous × (1 − f) + current``. It needs two numbers per key and
minute, whatever the traffic, and it is exact when traffic is even over the previous minute; a
burst at the end of the previous minute is under-counted by at most what the fixed buckets would
miss. A request is refused when its one request would take the requests used past ``rpm``, or
when the tokens used already reach ``tpm`` (a request's tokens are known only as it runs: its
prompt is charged when it is admitted, its completion when it ends).

:class:`LocalQuotas` keeps the buckets in this process: it is the ``memory`` backend and the
fallback of the ``redis`` backend while Redis is unavailable (each replica then enforces the full
limits on its own, so the fleet may admit up to replicas × the limits until Redis answers again).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

WINDOW_S = 60.0
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


def window_used(prev: float, cur: float, now: float, window_s: float = WINDOW_S) -> float:
    """The sliding-window estimate of what was used in the last ``window_s`` at ``now``."""
    bucket = math.floor(now / window_s)
    frac = (now - bucket * window_s) / window_s
    return prev * (1.0 - frac) + cur


def wait_for_room(
    prev: float, cur: float, cost: float, limit: float, now: float, window_s: float = WINDOW_S
) -> float:
    """Seconds until ``cost`` more fits under ``limit`` if nothing else is used (a Retry-After)."""
    bucket = math.floor(now / window_s)
    frac = (now - bucket * window_s) / window_s
    room = limit - cur - cost
    if room >= 0 and prev > 0:  # the previous bucket's share decays enough within this bucket
        return max(0.0, (1.0 - room / prev) - frac) * window_s
    # wait for the next bucket: then ``cur`` becomes the previous one, decaying from its start
    room_next = limit - cost
    need = 1.0 if cur <= 0 else max(0.0, 1.0 - room_next / cur)
    return (1.0 - frac) * window_s + need * window_s


class _Buckets:
    __slots__ = ("bucket", "cur", "prev")

    def __init__(self) -> None:
        self.bucket = -1
        self.cur = 0.0
        self.prev = 0.0

    def roll(self, bucket: int) -> None:
        if bucket == self.bucket:
            return
        self.prev = self.cur if bucket == self.bucket + 1 else 0.0
        self.cur = 0.0
        self.bucket = bucket


class LocalQuotas:
    """Rate limits in this process (see the module docstring); ``now`` is wall-clock seconds."""

    def __init__(self, window_s: float = WINDOW_S, max_keys: int = 100_000) -> None:
        self.window_s = window_s
        self._buckets: dict[str, _Buckets] = {}
        self._max_keys = max_keys

    def _get(self, key: str, bucket: int) -> _Buckets:
        b = self._buckets.get(key)
        if b is None:
            if len(self._buckets) >= self._max_keys:
                self._buckets.clear()  # bounded memory; forgetting only ever admits more
            b = self._buckets[key] = _Buckets()
        b.roll(bucket)
        return b

    def acquire(self, quota: TenantQuota, key_id: str, tokens: int, now: float) -> QuotaDecision:
        """Admit (charging one request and ``tokens``) or refuse with a reason and a wait."""
        bucket = math.floor(now / self.window_s)
        checks = (
            (QuotaReason.TENANT_RPM, "r:" + quota.tenant, quota.rpm, 1.0),
            (QuotaReason.TENANT_TPM, "t:" + quota.tenant, quota.tpm, 0.0),
            (QuotaReason.KEY_RPM, "kr:" + key_id, quota.key_rpm, 1.0),
            (QuotaReason.KEY_TPM, "kt:" + key_id, quota.key_tpm, 0.0),
        )
        for reason, key, limit, cost in checks:
            if not limit:
                continue
            b = self._get(key, bucket)
            used = window_used(b.prev, b.cur, now, self.window_s)
            if (cost and used + cost > limit) or (not cost and used >= limit):
                wait = wait_for_room(b.prev, b.cur, max(cost, 1.0), limit, now, self.window_s)
                return QuotaDecision(False, reason, max(1.0, wait), shared=False)
        for _, key, limit, cost in checks:
            if limit:
                self._get(key, bucket).cur += cost or tokens
        return ADMITTED_LOCALLY

    def charge(self, quota: TenantQuota, key_id: str, tokens: int, now: float) -> None:
        """Add a finished request's completion tokens to the token limits."""
        if tokens <= 0:
            return
        bucket = math.floor(now / self.window_s)
        if quota.tpm:
            self._get("t:" + quota.tenant, bucket).cur += tokens
        if quota.key_tpm:
            self._get("kt:" + key_id, bucket).cur += tokens
