"""Cancelling warming instances (the ``cancel_warming`` rule): the plan cancels warming instances
before it stops warm ones, never more than the policy allows; the policy allows it only for
instances neither this decision nor the previous one asks for, and never while the SLO fails."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.autoscale import (
    ActionKind,
    PoolSignal,
    PoolSpec,
    ScaleAction,
    ScaleDecision,
    TokenplaneParams,
    TokenplaneScaler,
)
from tokenplane.core.autoscale.evidence import cancellable_warming, recovered
from tokenplane.core.autoscale.plan import plan_actions
from tokenplane.core.views import InstanceView


def _count(actions: tuple[ScaleAction, ...], kind: ActionKind) -> int:
    return sum(a.count for a in actions if a.kind is kind)


def _pool(serving: int, warm: int, warming: int, *, kv: float = 0.2, **kw: object) -> PoolSignal:
    return PoolSignal(
        now=kw.pop("now", 0.0),  # type: ignore[arg-type]
        serving=tuple(InstanceView(f"s{k:02d}", running=2, kv_usage=kv) for k in range(serving)),
        warm=tuple(f"w{k}" for k in range(warm)),
        warming=tuple(f"c{k}" for k in range(warming)),
        **kw,  # type: ignore[arg-type]
    )


@settings(max_examples=300, deadline=None)
@given(
    serving=st.integers(0, 12),
    warm=st.integers(0, 6),
    warming=st.integers(0, 6),
    target=st.integers(0, 20),
    target_warm=st.integers(0, 8),
    allowed=st.integers(-2, 8),
    park=st.booleans(),
)
def test_plan_cancels_warming_first_and_never_more_than_allowed(
    serving: int, warm: int, warming: int, target: int, target_warm: int, allowed: int, park: bool
) -> None:
    spec = PoolSpec(min_instances=0, max_instances=40, cold_start_s=60.0, capacity_rps=1.0)
    sig = _pool(serving, warm, warming)
    kw = {"target_serving": target, "target_warm": target_warm, "park_drained": park}
    plan = plan_actions(sig, spec, cancel_warming=allowed, **kw)  # type: ignore[arg-type]
    cancelled = _count(plan, ActionKind.CANCEL_WARMING)
    assert cancelled <= min(warming, max(0, allowed))
    if _count(plan, ActionKind.STOP_WARM):  # a ready warm instance goes only after every cancellable one
        assert cancelled == min(warming, max(0, allowed))
    if cancelled:
        assert _count(plan, ActionKind.START_COLD) == 0  # never cancel and buy in one decision
    # Serving is unchanged by the rule (it only chooses which non-serving instances go), and what
    # is left warm, warming or parked still covers the warm target and the serving gap.
    base = plan_actions(sig, spec, **kw)  # type: ignore[arg-type]
    assert _count(plan, ActionKind.ACTIVATE_WARM) == _count(base, ActionKind.ACTIVATE_WARM)
    drained = _count(plan, ActionKind.DRAIN) + _count(plan, ActionKind.DRAIN_TO_WARM)
    assert drained == _count(base, ActionKind.DRAIN) + _count(base, ActionKind.DRAIN_TO_WARM)
    left = (
        warm
        - _count(plan, ActionKind.ACTIVATE_WARM)
        - _count(plan, ActionKind.STOP_WARM)
        + warming
        - cancelled
        + _count(plan, ActionKind.DRAIN_TO_WARM)
        + _count(plan, ActionKind.START_COLD)
    )
    left_base = (
        warm
        - _count(base, ActionKind.ACTIVATE_WARM)
        - _count(base, ActionKind.STOP_WARM)
        + warming
        + _count(base, ActionKind.DRAIN_TO_WARM)
        + _count(base, ActionKind.START_COLD)
    )
    assert left <= left_base  # cancelling only ever holds fewer GPUs
    short = max(0, target - serving - warm)
    assert left >= min(left_base, target_warm + short)  # ... never fewer than the targets need
    if allowed <= 0:
        assert plan == base


@settings(max_examples=300, deadline=None)
@given(
    serving=st.integers(0, 12),
    warm=st.integers(0, 6),
    warming=st.integers(0, 6),
    asked=st.integers(0, 30),
    previous=st.none() | st.integers(0, 30),
    slo_failing=st.booleans(),
)
def test_the_rule_keeps_what_this_or_the_previous_decision_asked_for(
    serving: int, warm: int, warming: int, asked: int, previous: int | None, slo_failing: bool
) -> None:
    sig = _pool(serving, warm, warming)
    n = cancellable_warming(sig, asked, previous=previous, slo_failing=slo_failing)
    held = serving + warm + warming
    assert 0 <= n <= warming
    if slo_failing or previous is None:
        assert n == 0
    if n:
        assert held - n >= max(asked, previous or 0)
    else:
        assert warming == 0 or slo_failing or previous is None or held <= max(asked, previous)


SPEC = PoolSpec(
    min_instances=1,
    max_instances=12,
    warm_pool_size=0,
    cold_start_s=131.0,
    warm_activation_s=5.0,
    capacity_rps=4.0,
    ttft_slo_s=2.0,
)


def _params(cancel: bool) -> TokenplaneParams:
    return TokenplaneParams(
        learn_capacity=False,
        learn_burstiness=False,
        burst_k=0.0,
        window_from_cold_start=True,
        cancel_warming=cancel,
    )


def _step(s: TokenplaneScaler, sig: PoolSignal) -> ScaleDecision:
    s.observe(sig, SPEC)
    d = s.decide(sig, SPEC, now=sig.now)
    s.commit(d, now=sig.now)
    return d


def _kv_episode(cancel: bool, *, attainment: float | None, served: float | None = 8.0) -> list[ScaleDecision]:
    """4 instances at 8 req/s; KV use 0.95 for two decisions (a cold start is bought), then 0.3."""
    s = TokenplaneScaler(_params(cancel))
    arrivals = tuple((t * 15.0, 8.0) for t in range(20))
    out: list[ScaleDecision] = []
    warming = 0
    for k in range(8):
        kv = 0.95 if k in (1, 2) else 0.3
        sig = _pool(
            4,
            0,
            warming,
            kv=kv,
            now=300.0 + 15.0 * k,
            arrivals=arrivals,
            throughput_rps=served,
            ttft_attainment=attainment,
            ttft_p90_s=0.5,
        )
        d = _step(s, sig)
        warming += d.cold_starts - d.warming_cancelled
        out.append(d)
    return out


def test_a_cold_start_bought_for_a_kv_episode_is_cancelled_when_it_ends() -> None:
    with_rule = _kv_episode(True, attainment=0.99)
    assert sum(d.cold_starts for d in with_rule) == 2  # 4 x 0.95 / 0.75 -> 6
    assert sum(d.warming_cancelled for d in with_rule) == 2
    cancel_at = [k for k, d in enumerate(with_rule) if d.warming_cancelled]
    bought_at = next(k for k, d in enumerate(with_rule) if d.cold_starts)
    # Bought on the second KV decision; the first decision without the need keeps it (the previous
    # one asked for it), the second cancels it: two decisions, not a cold start, of GPU time.
    assert cancel_at == [bought_at + 2]
    without = _kv_episode(False, attainment=0.99)
    assert sum(d.cold_starts for d in without) == 2
    assert not any(d.warming_cancelled for d in without)


def test_nothing_warming_is_cancelled_while_the_slo_fails_under_load() -> None:
    """Attainment 0.5 in every window: the SLO term holds what is warming while the pool has not
    caught up (here: no throughput measured, so recovery is unknown)."""
    failing = _kv_episode(True, attainment=0.5, served=None)
    assert sum(d.cold_starts for d in failing) >= 1
    assert not any(d.warming_cancelled for d in failing)


def test_a_failing_window_of_a_pool_that_caught_up_does_not_hold_its_cold_starts() -> None:
    """The same episode, the windows still failing (they judge arrivals up to a minute ago) but
    the pool caught up (no backlog, KV under kv_high): the cold starts go as with the SLO met."""
    caught_up = _kv_episode(True, attainment=0.5)
    assert sum(d.warming_cancelled for d in caught_up) == sum(d.cold_starts for d in caught_up) >= 1


@settings(max_examples=300, deadline=None)
@given(
    backlog=st.integers(0, 400),
    more=st.integers(0, 400),
    served=st.none() | st.floats(0.0, 100.0),
    kv=st.floats(0.0, 1.0),
    slo=st.none() | st.floats(0.1, 30.0),
)
def test_recovered_is_monotone_in_backlog_and_never_under_kv_pressure(
    backlog: int, more: int, served: float | None, kv: float, slo: float | None
) -> None:
    """The leading check that lets a failing SLO window's cold starts go: a larger backlog never
    turns it on, KV use at ``kv_high`` or an unknown rate or SLO keeps it off."""
    p = TokenplaneParams()
    spec = PoolSpec(max_instances=8, capacity_rps=1.0, cold_start_s=60.0, ttft_slo_s=slo)

    def check(q: int) -> bool:
        sig = _pool(2, 0, 1, kv=kv, queued=q, throughput_rps=served)
        return recovered(sig, spec, p)

    if check(backlog + more):
        assert check(backlog)
    if kv >= p.kv_high or served is None or served <= 0 or slo is None:
        assert not check(backlog)
    if check(backlog):
        assert served is not None and slo is not None
        assert backlog <= (1.0 - p.comfort_fraction) * slo * served + 1e-9
