"""Per-minute limits in one process (the memory backend, and every backend's fallback)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.shared_state.quotas import SLOTS, LocalQuotas, QuotaReason, TenantQuota

MINUTE = 60.0
T0 = 1_000 * MINUTE  # the start of a window (and of a slot)
SLOT = MINUTE / SLOTS


def test_rpm_admits_exactly_the_limit_in_a_fresh_minute_then_refuses_with_a_wait() -> None:
    q = LocalQuotas()
    quota = TenantQuota("acme", rpm=5)
    decisions = [q.acquire(quota, "", 10, T0 + i) for i in range(8)]
    assert [d.admit for d in decisions] == [True] * 5 + [False] * 3
    refused = decisions[-1]
    assert refused.reason is QuotaReason.TENANT_RPM
    assert refused.retry_after_s >= 1.0
    # the wait it names is enough: one request fits then
    assert q.acquire(quota, "", 10, T0 + 7 + refused.retry_after_s + 0.01).admit


def test_what_was_used_leaves_the_count_a_slot_at_a_time_a_minute_later() -> None:
    q = LocalQuotas()
    quota = TenantQuota("acme", rpm=10)
    for i in range(10):  # 5 in the first slot, 5 in the second
        assert q.acquire(quota, "", 0, T0 + (i // 5) * SLOT + 0.1).admit
    assert not q.acquire(quota, "", 0, T0 + MINUTE).admit  # the first slot still counts
    # one whole minute after the first slot ended, its 5 are gone, the second slot's not yet
    admitted = sum(q.acquire(quota, "", 0, T0 + MINUTE + SLOT + 0.01 * i).admit for i in range(10))
    assert admitted == 5


def test_a_burst_then_steady_demand_never_passes_the_limit_in_any_sliding_minute() -> None:
    """The case two weighted fixed buckets get wrong: the limit spent at once, a third of the way
    into a bucket, then demand every second: no 60 s span holds more than the limit."""
    q = LocalQuotas()
    quota = TenantQuota("acme", rpm=60)
    admitted: list[float] = []
    now = T0 + 20
    for _ in range(60):
        admitted += [now] if q.acquire(quota, "", 0, now).admit else []
    while now < T0 + 5 * MINUTE:
        now += 0.25
        admitted += [now] if q.acquire(quota, "", 0, now).admit else []
    assert max(sum(1 for t in admitted if s <= t < s + MINUTE) for s in admitted) <= 60
    assert len(admitted) >= 60 * 4 * SLOTS / (SLOTS + 1)  # and it does not starve: ~limit a minute


def test_tpm_refuses_once_spent_and_completion_tokens_count() -> None:
    q = LocalQuotas()
    quota = TenantQuota("acme", tpm=100)
    assert q.acquire(quota, "", 60, T0).admit
    q.charge(quota, "", 50, T0 + 1)  # the answer's tokens: 110 used
    d = q.acquire(quota, "", 1, T0 + 2)
    assert not d.admit and d.reason is QuotaReason.TENANT_TPM


def test_key_limits_are_per_key_and_tenant_limits_span_keys() -> None:
    q = LocalQuotas()
    quota = TenantQuota("acme", rpm=3, key_rpm=2)
    assert q.acquire(quota, "k1", 0, T0).admit
    assert q.acquire(quota, "k1", 0, T0).admit
    d = q.acquire(quota, "k1", 0, T0)
    assert not d.admit and d.reason is QuotaReason.KEY_RPM
    assert q.acquire(quota, "k2", 0, T0).admit
    d = q.acquire(quota, "k2", 0, T0)
    assert not d.admit and d.reason is QuotaReason.TENANT_RPM


@settings(max_examples=60, deadline=None)
@given(
    limit=st.integers(1, 50),
    gaps=st.lists(st.floats(0.0, 8.0, allow_nan=False), min_size=1, max_size=200),
    tokens=st.integers(0, 20),
)
def test_never_more_than_the_limit_within_any_sliding_minute(
    limit: int, gaps: list[float], tokens: int
) -> None:
    """Whatever the arrivals, no span of a minute admits more than ``rpm`` requests, nor more
    tokens than ``tpm`` plus the one request that found room (and a refusal's wait is positive)."""
    q = LocalQuotas()
    quota = TenantQuota("t", rpm=limit, tpm=limit * 10)
    now = T0
    admitted: list[float] = []
    for gap in gaps:
        now += gap
        d = q.acquire(quota, "", tokens, now)
        if d.admit:
            admitted.append(now)
        else:
            assert d.retry_after_s > 0
    for start in admitted:
        inside = sum(1 for t in admitted if start <= t < start + MINUTE - 1e-6)
        assert inside <= limit
        assert inside * tokens < limit * 10 + tokens


@settings(max_examples=60, deadline=None)
@given(
    arrivals=st.lists(st.floats(0.0, 2 * MINUTE, allow_nan=False), min_size=1, max_size=60),
    limit=st.integers(1, 20),
    at=st.floats(0.0, 2 * MINUTE, allow_nan=False),
)
def test_waiting_the_named_time_makes_room(arrivals: list[float], limit: int, at: float) -> None:
    q = LocalQuotas()
    quota = TenantQuota("t", rpm=limit)
    for t in sorted(arrivals):
        q.acquire(quota, "", 0, T0 + t)
    now = T0 + 2 * MINUTE + at
    d = q.acquire(quota, "", 0, now)
    if d.admit:
        return
    assert d.retry_after_s > 0
    assert q.acquire(quota, "", 0, now + d.retry_after_s + 1e-6).admit
