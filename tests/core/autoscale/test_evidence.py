"""The tokenplane scaler's evidence rules (each a param, all on in bench/autoscale_suite.py): falls
read as rises, served rates as capacity bounds, no scale-up on an unproven estimate while latency is
comfortable, the TTFT budget as a queue buffer, and windows as long as a cold start."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.autoscale import (
    ActionKind,
    PoolSignal,
    PoolSpec,
    ScaleReason,
    TokenplaneParams,
    TokenplaneScaler,
)
from tokenplane.core.autoscale.burst import fall_sample, rise_sample
from tokenplane.core.autoscale.forecast import holt_forecast
from tokenplane.core.autoscale.plan import plan_actions
from tokenplane.core.views import InstanceView

BUCKET = 15.0
SPEC = PoolSpec(
    min_instances=1,
    max_instances=40,
    warm_pool_size=0,
    cold_start_s=90.0,
    warm_activation_s=5.0,
    capacity_rps=4.0,
    ttft_slo_s=1.0,
)


def _suite_pool(capacity_rps: float) -> PoolSpec:
    """The suite's pool shape: 1-16 instances, no warm pool, a 68 s cold start, a 1 s TTFT SLO."""
    return PoolSpec(
        min_instances=1,
        max_instances=16,
        warm_pool_size=0,
        cold_start_s=68.0,
        warm_activation_s=5.0,
        capacity_rps=capacity_rps,
        ttft_slo_s=1.0,
    )


def history(rates: list[float], end: float) -> tuple[tuple[float, float], ...]:
    n = len(rates)
    return tuple((end - (n - i) * BUCKET, r) for i, r in enumerate(rates))


def signal(now: float, rates: list[float], n: int, *, waiting: int = 0, **kw: object) -> PoolSignal:
    serving = tuple(InstanceView(f"i{k:02d}", running=2, waiting=waiting, kv_usage=0.2) for k in range(n))
    return PoolSignal(now=now, serving=serving, arrivals=history(rates, now), **kw)  # type: ignore[arg-type]


@settings(max_examples=50, deadline=None)
@given(rates=st.lists(st.floats(0.0, 100.0), min_size=8, max_size=8))
def test_a_fall_is_the_rise_of_the_reversed_history(rates: list[float]) -> None:
    """On a history one level minute plus one horizon long (4 + 4 buckets of 15 s), fall_sample
    measures what rise_sample measures on it read backwards (level: the newest minute; peak: the
    horizon before it)."""
    fwd = history(rates, 1000.0)
    rev = history(rates[::-1], 1000.0)
    fall, rise = fall_sample(fwd, 60.0), rise_sample(rev, 60.0)
    assert (fall is None) == (rise is None)
    if fall is not None and rise is not None:
        assert fall.level_rps == pytest.approx(rise.level_rps) and fall.peak_rps == rise.peak_rps
        assert fall.at_s == fwd[-1][0]


def test_a_pool_that_starts_inside_a_burst_keeps_capacity_for_the_next_one() -> None:
    """Burst (80 req/s) then quiet (0.3 req/s): with symmetric bursts the end of the burst teaches
    the rise, so the quiet pool keeps serving + warm for the burst; without, it has seen no rise."""
    rates = [80.0] * 24 + [0.3] * 16
    params = {"learn_capacity": False, "burst_half_life_s": 1800.0}
    on = TokenplaneScaler(TokenplaneParams(symmetric_bursts=True, **params))  # type: ignore[arg-type]
    off = TokenplaneScaler(TokenplaneParams(**params))  # type: ignore[arg-type]
    spec = _suite_pool(20.0)
    end = len(rates) * BUCKET
    for k in range(8, len(rates) + 1):
        now = k * BUCKET
        for s in (on, off):
            s.observe(signal(now, rates[:k], 4, throughput_rps=min(80.0, rates[k - 1])), spec)
    d_on = on.decide(signal(end, rates, 1, throughput_rps=0.3), spec, now=end)
    d_off = off.decide(signal(end, rates, 1, throughput_rps=0.3), spec, now=end)
    assert d_on.target_serving + d_on.target_warm >= 4  # 80 req/s at 20 each, in a cold start
    assert d_off.target_serving + d_off.target_warm <= 2


def test_a_served_rate_is_a_capacity_bound_not_a_sample_to_average() -> None:
    base = {"capacity_prior_weight": 2.0}
    jump = TokenplaneScaler(TokenplaneParams(capacity_lower_bounds=True, **base))  # type: ignore[arg-type]
    avg = TokenplaneScaler(TokenplaneParams(**base))  # type: ignore[arg-type]
    sig = signal(600.0, [60.0] * 20, 4, throughput_rps=60.0, ttft_p90_s=0.9, ttft_attainment=1.0)
    for s in (jump, avg):
        s.observe(sig, SPEC)
    assert jump.capacity_rps(SPEC) == 15.0  # 60 req/s over 4 instances, not saturated: >= 15
    assert SPEC.capacity_rps < avg.capacity_rps(SPEC) < 15.0


def test_comfortable_latency_holds_off_a_scale_up_on_an_unproven_estimate() -> None:
    """The prior says 4 req/s; 4 instances serve 40 req/s with p90 at a tenth of the SLO. With
    trust_latency the pool holds; the queue term still adds capacity once a queue forms."""
    trusting = TokenplaneScaler(TokenplaneParams(trust_latency=True, learn_capacity=False))
    plain = TokenplaneScaler(TokenplaneParams(learn_capacity=False))
    calm = signal(600.0, [40.0] * 20, 4, throughput_rps=40.0, ttft_p90_s=0.1, ttft_attainment=1.0)
    assert trusting.decide(calm, SPEC, now=600.0).target_serving == 4
    assert plain.decide(calm, SPEC, now=600.0).target_serving > 4
    queued = signal(600.0, [40.0] * 20, 4, waiting=20, throughput_rps=40.0, ttft_p90_s=0.1)
    d = trusting.decide(queued, SPEC, now=600.0)
    assert d.target_serving > 4 and d.reason is ScaleReason.QUEUE_GROWING


def test_the_ttft_budget_buffers_a_short_rise() -> None:
    """A 5 s TTFT budget absorbs part of the rise over a 20 s activation horizon: the buffered
    scaler plans for r H / (H + S) of the peak, never less than the level."""
    spec = PoolSpec(
        min_instances=1,
        max_instances=40,
        warm_pool_size=0,
        cold_start_s=90.0,
        warm_activation_s=5.0,
        capacity_rps=1.0,
        ttft_slo_s=5.0,
    )
    common = {"learn_capacity": False, "learn_burstiness": False, "target_utilisation": 1.0}
    buffered = TokenplaneScaler(TokenplaneParams(queue_buffer=True, **common))  # type: ignore[arg-type]
    plain = TokenplaneScaler(TokenplaneParams(**common))  # type: ignore[arg-type]
    sig = signal(600.0, [10.0, 30.0] * 10, 10, throughput_rps=20.0)
    a = buffered.decide(sig, spec, now=600.0).needs
    b = plain.decide(sig, spec, now=600.0).needs
    assert a is not None and b is not None
    assert a.forecast_rps < b.forecast_rps
    assert a.forecast_rps >= b.forecast_rps * 20.0 / 25.0 - 1e-9


def test_windows_as_long_as_a_cold_start_and_none_before_the_first() -> None:
    """With window_from_cold_start no shrink happens within one cold start (+ a decision) of the
    first decision, and a recommendation older than that no longer holds the pool."""
    s = TokenplaneScaler(TokenplaneParams(window_from_cold_start=True, learn_capacity=False))
    quiet = [4.0] * 20  # one instance's worth at the prior
    span = SPEC.cold_start_s + 15.0
    d = s.decide(signal(15.0, quiet, 8, throughput_rps=4.0), SPEC, now=15.0)
    s.commit(d, now=15.0)
    assert d.target_serving == 8 and d.reason is ScaleReason.COOLDOWN
    t = 15.0 + span + 15.0
    d = s.decide(signal(t, quiet, 8, throughput_rps=4.0), SPEC, now=t)
    assert d.target_serving < 8 and d.reason is ScaleReason.OVERPROVISIONED


def cold_starts(d: object) -> int:
    return sum(a.count for a in d.actions if a.kind is ActionKind.START_COLD)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("second", "started"),
    [
        (40.0, 0),  # a one-decision spike: gone before a cold start could land
        (90.0, 2),  # asked again: two more instances (90 req/s at 20 each needs 5, 3 are here)
    ],
)
def test_a_cold_start_needs_a_need_two_decisions_ask_for(second: float, started: int) -> None:
    spec = _suite_pool(20.0)
    params = TokenplaneParams(
        window_from_cold_start=True,
        learn_capacity=False,
        learn_burstiness=False,
        target_utilisation=1.0,
        burst_k=0.0,
        forecast_alpha=1.0,  # the forecast is the last bucket: the spike's need is the spike's
        forecast_beta=0.0,
    )
    s = TokenplaneScaler(params)
    calm = [40.0] * 20
    d = s.decide(signal(600.0, calm, 3, throughput_rps=40.0), spec, now=600.0)
    s.commit(d, now=600.0)
    assert cold_starts(d) == 0 and d.target_serving == 3
    spike = signal(615.0, [*calm[1:], 90.0], 3, waiting=30, throughput_rps=60.0)
    d = s.decide(spike, spec, now=615.0)
    assert d.target_serving > 3 and cold_starts(d) == 0  # asked for, not yet bought
    s.commit(d, now=615.0)
    nxt = signal(630.0, [*calm[2:], 90.0, second], 3, waiting=30 if second > 40 else 0, throughput_rps=60.0)
    d = s.decide(nxt, spec, now=630.0)
    assert cold_starts(d) == started
    # Without the rule the spike alone buys the cold starts.
    plain = TokenplaneScaler(msgspec.structs.replace(params, window_from_cold_start=False))
    d = plain.decide(signal(600.0, calm, 3, throughput_rps=40.0), spec, now=600.0)
    plain.commit(d, now=600.0)
    assert cold_starts(plain.decide(spike, spec, now=615.0)) > 0


@settings(max_examples=200, deadline=None)
@given(
    serving=st.integers(0, 12),
    warm=st.integers(0, 6),
    warming=st.integers(0, 6),
    target=st.integers(0, 20),
    target_warm=st.integers(0, 8),
    cap=st.integers(-3, 10),
)
def test_plan_actions_never_starts_more_than_max_cold_starts(
    serving: int, warm: int, warming: int, target: int, target_warm: int, cap: int
) -> None:
    """max_cold_starts bounds only the cold starts: every other action is the unbounded plan's."""
    spec = PoolSpec(min_instances=0, max_instances=24, cold_start_s=60.0, capacity_rps=1.0)
    sig = PoolSignal(
        now=0.0,
        serving=tuple(InstanceView(f"s{k}") for k in range(serving)),
        warm=tuple(f"w{k}" for k in range(warm)),
        warming=tuple(f"c{k}" for k in range(warming)),
    )
    free = plan_actions(sig, spec, target_serving=target, target_warm=target_warm)
    bound = plan_actions(sig, spec, target_serving=target, target_warm=target_warm, max_cold_starts=cap)
    assert cold_starts(type("D", (), {"actions": bound})()) <= max(0, cap)
    assert cold_starts(type("D", (), {"actions": bound})()) == min(
        cold_starts(type("D", (), {"actions": free})()), max(0, cap)
    )
    others = [a for a in free if a.kind not in (ActionKind.START_COLD, ActionKind.NOOP)]
    assert [a for a in bound if a.kind not in (ActionKind.START_COLD, ActionKind.NOOP)] == others


def test_the_warm_pool_held_on_measured_rises_is_buffered_too() -> None:
    """A quiet pool that has seen 2 -> 82 req/s rises within a cold start, at 20.3 req/s per
    instance: 82 needs 5 (4.04), the buffered 82 x 83 / (83 + 1) needs 4 (3.99). While trust_latency
    holds the demand term the warm pool is sized from those rises alone, buffered like the rest."""
    spec = _suite_pool(20.3)
    params = TokenplaneParams(
        learn_capacity=False,
        target_utilisation=1.0,
        burst_k=0.0,
        burst_half_life_s=1800.0,
        trust_latency=True,
        queue_buffer=True,
    )
    s = TokenplaneScaler(params)
    rates = [2.0] * 8 + [82.0] * 8 + [2.0] * 24
    for k in range(2, len(rates) + 1):
        s.observe(signal(k * BUCKET, rates[:k], 4, throughput_rps=min(rates[k - 1], 80.0)), spec)
    now = len(rates) * BUCKET
    # Three serving: the demand term (4) is above the pool, latency is comfortable, so it is held.
    calm = signal(now, rates, 3, throughput_rps=2.0, ttft_p90_s=0.1, ttft_attainment=1.0)
    d = s.decide(calm, spec, now=now)
    assert d.needs is not None and d.needs.demand == 3 and d.needs.provision == 4
    assert d.target_serving + d.target_warm == 4


def _ramp_pool_and_rates() -> tuple[PoolSpec, list[float]]:
    """A rising ramp whose damped trend, extrapolated over a cold start, lands 3.1 instances' worth
    of capacity (over three, within 3 / 0.95 = 3.16) while the activation horizon needs three."""
    rates = [40.0 + 2.0 * k for k in range(12)]
    cold = holt_forecast(history(rates, 180.0), horizon_s=68.0 + 15.0, burst_k=0.0).upper_rps
    act = holt_forecast(history(rates, 180.0), horizon_s=5.0 + 15.0, burst_k=0.0).upper_rps
    spec = _suite_pool(cold / 3.1)
    assert act <= 3 * spec.capacity_rps  # serving needs three: only the warm pool is in question
    return spec, rates


@pytest.mark.parametrize("attainment", [1.0, 0.96, None])
def test_the_warm_pool_covers_the_share_of_the_peak_the_slo_asks_for(attainment: float | None) -> None:
    """warm_slo_share: a forecast 3 % over three instances within a cold start buys no warm fourth
    while the SLO is met (at most 5 % of requests may miss; the peak's excess is 3 %); without the
    rule, or with attainment unknown, it does."""
    spec, rates = _ramp_pool_and_rates()
    base = {"learn_capacity": False, "learn_burstiness": False, "target_utilisation": 1.0, "burst_k": 0.0}
    sig = signal(180.0, rates, 3, throughput_rps=rates[-1], ttft_p90_s=0.3, ttft_attainment=attainment)
    on = TokenplaneScaler(TokenplaneParams(warm_slo_share=True, **base)).decide(sig, spec, now=180.0)  # type: ignore[arg-type]
    off = TokenplaneScaler(TokenplaneParams(**base)).decide(sig, spec, now=180.0)  # type: ignore[arg-type]
    assert on.target_serving == off.target_serving == 3
    assert off.target_warm == 1
    assert on.target_warm == (1 if attainment is None else 0)


@settings(max_examples=100, deadline=None)
@given(
    rates=st.lists(st.floats(0.0, 200.0), min_size=4, max_size=24),
    n=st.integers(1, 12),
    capacity=st.floats(1.0, 40.0),
    attainment=st.one_of(st.none(), st.floats(0.0, 1.0)),
    p90=st.floats(0.0, 3.0),
)
def test_warm_slo_share_only_ever_shrinks_the_warm_pool(
    rates: list[float], n: int, capacity: float, attainment: float | None, p90: float
) -> None:
    """The rule changes nothing but the warm target, and only downward."""
    spec = _suite_pool(capacity)
    sig = signal(600.0, rates, n, throughput_rps=rates[-1], ttft_p90_s=p90, ttft_attainment=attainment)
    base = {"target_utilisation": 1.0, "queue_buffer": True, "trust_latency": True}
    on = TokenplaneScaler(TokenplaneParams(warm_slo_share=True, **base)).decide(sig, spec, now=600.0)  # type: ignore[arg-type]
    off = TokenplaneScaler(TokenplaneParams(**base)).decide(sig, spec, now=600.0)  # type: ignore[arg-type]
    assert on.target_serving == off.target_serving
    assert on.target_warm <= off.target_warm
