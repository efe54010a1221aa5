"""The learning parts of the tokenplane scaler: capacity from throughput (the prior only seeds it),
headroom from measured burstiness, and decisions that say why with those figures."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.autoscale import (
    CapacityEstimate,
    PoolSignal,
    PoolSpec,
    ScaleReason,
    TokenplaneParams,
    TokenplaneScaler,
)
from tokenplane.core.autoscale.burst import BurstMemory, rise_sample
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


def history(rates: list[float], end: float) -> tuple[tuple[float, float], ...]:
    """Complete buckets ending at ``end`` (the last one starts at ``end - BUCKET``)."""
    n = len(rates)
    return tuple((end - (n - i) * BUCKET, r) for i, r in enumerate(rates))


def signal(now: float, rates: list[float], n: int, **kw: object) -> PoolSignal:
    waiting = int(kw.pop("waiting", 0))  # type: ignore[call-overload]
    serving = tuple(InstanceView(f"i{k:02d}", running=2, waiting=waiting, kv_usage=0.2) for k in range(n))
    return PoolSignal(now=now, serving=serving, arrivals=history(rates, now), **kw)  # type: ignore[arg-type]


# -- capacity ----------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    true_cap=st.floats(0.5, 50.0),
    prior_factor=st.floats(0.2, 5.0),
    seed=st.integers(0, 10_000),
)
def test_capacity_estimate_converges_to_the_true_capacity(
    true_cap: float, prior_factor: float, seed: int
) -> None:
    """Saturated windows measure the true capacity with 10 % noise; the estimate ends within 10 %
    of it wherever the prior was (inside the bound), and the prior's share decays to almost 0."""
    rng = random.Random(seed)
    prior = true_cap * prior_factor
    est = CapacityEstimate()
    shares = [est.prior_share]
    for _ in range(60):
        est = est.observe(true_cap * rng.uniform(0.9, 1.1), saturated=True, prior=prior, bound=8.0)
        shares.append(est.prior_share)
    assert est.get(prior, bound=8.0) == pytest.approx(true_cap, rel=0.1)
    assert all(b < a for a, b in itertools.pairwise(shares))  # the prior's weight decays
    assert shares[-1] < 0.01


def test_capacity_prior_weight_is_as_stated() -> None:
    est = CapacityEstimate()
    assert est.get(2.0) == 2.0 and est.prior_share == 1.0  # the prior until measured
    assert est.observe(1.0, saturated=False, prior=2.0) is est  # unsaturated and below: no news
    one = est.observe(5.0, saturated=True, prior=2.0, rate=0.2, prior_weight=2.0)
    # (0.8 × 2 × 2.0 + 5.0) / (0.8 × 2 + 1) = 8.2 / 2.6
    assert one.get(2.0) == pytest.approx(8.2 / 2.6)
    assert one.prior_share == pytest.approx(1.6 / 2.6)
    up = est.observe(3.0, saturated=False, prior=2.0, rate=0.2, prior_weight=2.0)
    assert 2.0 < up.get(2.0) < 3.0  # seen doing more: a measurement, weighed like one
    assert est.observe(1e6, saturated=True, prior=2.0, bound=4.0).get(2.0, bound=4.0) == 8.0
    assert est.observe(float("nan"), saturated=True, prior=2.0) is est


def test_scaler_learns_capacity_from_saturated_throughput_and_says_so() -> None:
    scaler = TokenplaneScaler()
    for k in range(30):  # 4 instances, a backlog, 40 req/s completed: 10 req/s each
        now = 600.0 + k * BUCKET
        scaler.observe(signal(now, [40.0] * 20, 4, waiting=5, throughput_rps=40.0), SPEC)
    assert scaler.capacity_rps(SPEC) == pytest.approx(10.0, rel=0.02)
    d = scaler.decide(signal(1200.0, [40.0] * 20, 4, throughput_rps=40.0), SPEC, now=1200.0)
    assert d.needs is not None and d.needs.capacity_prior_share < 0.01
    assert d.target_serving == 6  # ceil(40 / (10 × 0.75))
    assert d.reason is ScaleReason.FORECAST_RISE
    assert "10.00 req/s each" in d.note and "headroom" in d.note and "prior 0%" in d.note


def test_comfortable_latency_probes_capacity_up_and_a_breach_pulls_it_back() -> None:
    scaler = TokenplaneScaler()
    for k in range(10):  # p90 at a tenth of the SLO, each instance at its estimated capacity
        now = 600.0 + k * BUCKET
        cap = scaler.capacity_rps(SPEC)
        scaler.observe(
            signal(now, [8 * cap] * 20, 8, throughput_rps=8 * cap, ttft_p90_s=0.1, ttft_attainment=1.0),
            SPEC,
        )
    probed = scaler.capacity_rps(SPEC)
    assert probed > 1.5 * SPEC.capacity_rps
    for k in range(30):  # then the SLO breaks with a queue at 6 req/s each: that is the capacity
        now = 800.0 + k * BUCKET
        scaler.observe(
            signal(now, [48.0] * 20, 8, waiting=2, throughput_rps=48.0, ttft_p90_s=3.0, ttft_attainment=0.5),
            SPEC,
        )
    assert scaler.capacity_rps(SPEC) == pytest.approx(6.0, rel=0.05)


# -- burstiness --------------------------------------------------------------------------------


def test_rise_sample_and_memory_on_a_flat_and_a_bursty_series() -> None:
    flat = history([10.0] * 40, 600.0)
    s = rise_sample(flat, 90.0)
    assert s is not None and s.ratio == pytest.approx(1.0)
    # 2 req/s, then bursts of 16 req/s for 2 buckets every 12 buckets.
    rates = [16.0 if i % 12 in (10, 11) else 2.0 for i in range(240)]
    memory = BurstMemory(half_life_s=900.0)
    for end in range(12, 241):
        sample = rise_sample(history(rates[:end], end * BUCKET), 90.0)
        if sample is not None:
            memory = memory.add(sample)
    assert memory.headroom(0.95) == pytest.approx(8.0)  # the bursts carry most requests: keep them
    assert memory.peak(0.95) == pytest.approx(16.0)
    assert memory.size_for(2.0, 0.95) == pytest.approx(16.0)  # from the quiet level, hold the peak
    assert memory.size_for(16.0, 0.95) == pytest.approx(16.0)  # not 8 × 16: never above seen peaks
    assert rise_sample(history([1.0], 15.0), 90.0) is None


def test_a_one_off_rise_fades_from_the_headroom() -> None:
    rates = [4.0] * 20 + [20.0] * 20 + [4.0] * 400
    memory = BurstMemory(half_life_s=600.0)
    seen = []
    for end in range(2, len(rates) + 1):
        sample = rise_sample(history(rates[:end], end * BUCKET), 90.0)
        if sample is not None:
            memory = memory.add(sample)
            seen.append(memory.headroom(0.95))
    assert max(seen) == pytest.approx(5.0)
    assert seen[-1] == pytest.approx(1.0)


@st.composite
def load_histories(draw: st.DrawFn) -> list[float]:
    return draw(st.lists(st.floats(0.0, 200.0, allow_nan=False), min_size=12, max_size=60))


@settings(max_examples=80, deadline=None)
@given(
    rates=load_histories(),
    factor=st.floats(1.0, 5.0),
    n=st.integers(1, 30),
    waiting=st.integers(0, 20),
    extra_waiting=st.integers(0, 20),
)
def test_more_observed_load_never_lowers_the_target(
    rates: list[float], factor: float, n: int, waiting: int, extra_waiting: int
) -> None:
    """Same learned capacity (not learning it here), arrivals scaled up by ``factor`` and a longer
    queue: the serving target and the warm target together never go down."""
    params = TokenplaneParams(learn_capacity=False)

    def target(scale: float, wait: int) -> tuple[int, int]:
        scaler = TokenplaneScaler(params)
        scaled = [r * scale for r in rates]
        for end in range(2, len(scaled) + 1):  # learn burstiness on the growing stream
            scaler.observe(signal(end * BUCKET, scaled[:end], n), SPEC)
        now = len(scaled) * BUCKET
        d = scaler.decide(signal(now, scaled, n, waiting=wait), SPEC, now=now)
        return d.target_serving, d.target_serving + d.target_warm

    base = target(1.0, waiting)
    more = target(factor, waiting + extra_waiting)
    assert more[0] >= base[0]
    assert more[1] >= base[1]
