"""Per-minute limits in one process (the memory backend, and every backend's fallback)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.shared_state.quotas import LocalQuotas, QuotaReason, TenantQuota, wait_for_room, window_used

MINUTE = 60.0
T0 = 1_000 * MINUTE  # the start of a bucket


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


def test_the_previous_minute_counts_in_proportion_to_its_overlap() -> None:
    q = LocalQuotas()
    quota = TenantQuota("acme", rpm=10)
    for i in range(10):
        assert q.acquire(quota, "", 0, T0 + i).admit
    # a quarter into the next minute, three quarters of the previous one still count: 7.5 used
    admitted = sum(q.acquire(quota, "", 0, T0 + MINUTE + 15 + i * 0.01).admit for i in range(10))
    assert admitted == 2


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
    gaps=st.lists(st.floats(0.0, 5.0, allow_nan=False), min_size=1, max_size=200),
)
def test_never_more_than_the_limit_within_any_one_bucket(limit: int, gaps: list[float]) -> None:
    """Whatever the arrivals, one fixed minute never admits more than ``rpm`` (and a refusal's
    wait is positive)."""
    q = LocalQuotas()
    quota = TenantQuota("t", rpm=limit)
    now = T0
    per_bucket: dict[int, int] = {}
    for gap in gaps:
        now += gap
        d = q.acquire(quota, "", 0, now)
        if d.admit:
            b = int(now // MINUTE)
            per_bucket[b] = per_bucket.get(b, 0) + 1
        else:
            assert d.retry_after_s > 0
    assert all(n <= limit for n in per_bucket.values())


@given(prev=st.floats(0, 1000), cur=st.floats(0, 1000), limit=st.floats(1, 1000), at=st.floats(0, 59.9))
def test_waiting_the_named_time_makes_room(prev: float, cur: float, limit: float, at: float) -> None:
    now = T0 + at
    if window_used(prev, cur, now) + 1 <= limit:
        return
    wait = wait_for_room(prev, cur, 1.0, limit, now)
    assert wait > 0
    later = now + wait + 1e-6
    rolled = int(later // MINUTE) - int(now // MINUTE)
    p, c = (prev, cur) if rolled == 0 else ((cur, 0.0) if rolled == 1 else (0.0, 0.0))
    assert window_used(p, c, later) + 1 <= limit + 1e-6
