"""The ``latency_queues`` evidence rule (a param, on in bench/autoscale_suite.py): a backlog served
within the TTFT SLO is neither saturation nor a queue to drain, and a quiet pool keeps serving
capacity for its remembered bursts at the rate served comfortably."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.autoscale import PoolSignal, PoolSpec, ScaleReason, TokenplaneParams, TokenplaneScaler
from tokenplane.core.autoscale.evidence import queue_within_slo
from tokenplane.core.views import InstanceView

BUCKET = 15.0
SPEC = PoolSpec(
    min_instances=1,
    max_instances=16,
    warm_pool_size=0,
    cold_start_s=68.0,
    warm_activation_s=5.0,
    capacity_rps=4.0,
    ttft_slo_s=1.0,
)
SUITE = {
    "target_utilisation": 1.0,
    "comfort_fraction": 0.8,
    "capacity_lower_bounds": True,
    "trust_latency": True,
    "queue_buffer": True,
}


def signal(now: float, rates: list[float], n: int, *, waiting: int = 0, **kw: object) -> PoolSignal:
    serving = tuple(InstanceView(f"i{k:02d}", running=8, waiting=waiting, kv_usage=0.3) for k in range(n))
    arrivals = tuple((now - (len(rates) - i) * BUCKET, r) for i, r in enumerate(rates))
    return PoolSignal(now=now, serving=serving, arrivals=arrivals, **kw)  # type: ignore[arg-type]


def test_a_queue_served_well_within_the_slo_is_not_saturation() -> None:
    """4 instances at 80 req/s with one waiting request each and TTFT p90 at 0.15 s of a 1 s SLO:
    the backlog's wait (4 / 80 s) fits the margin, so it is not a capacity measurement (no ceiling,
    the served rate only a lower bound) and no queue term scales the pool up. Without the rule the
    same window caps capacity at the served rate."""
    sig = signal(600.0, [80.0] * 20, 4, waiting=1, throughput_rps=80.0, ttft_p90_s=0.15, ttft_attainment=1.0)
    on = TokenplaneScaler(TokenplaneParams(latency_queues=True, **SUITE))  # type: ignore[arg-type]
    off = TokenplaneScaler(TokenplaneParams(**SUITE))  # type: ignore[arg-type]
    for s in (on, off):
        s.observe(sig, SPEC)
    assert on.state.capacity_rps.ceiling is None and on.capacity_rps(SPEC) >= 20.0
    assert off.state.capacity_rps.ceiling == 20.0
    d = on.decide(sig, SPEC, now=600.0)
    assert d.target_serving == 4 and d.needs is not None and d.needs.queue == 0


def test_a_queue_whose_wait_eats_the_margin_still_counts() -> None:
    """The same pool with 40 waiting (0.5 s of wait at 80 req/s, over the 0.2 s margin): saturated
    and drained by the queue term, although the lagging p90 still looks comfortable."""
    sig = signal(600.0, [80.0] * 20, 4, waiting=10, throughput_rps=80.0, ttft_p90_s=0.15, ttft_attainment=1.0)
    s = TokenplaneScaler(TokenplaneParams(latency_queues=True, **SUITE))  # type: ignore[arg-type]
    s.observe(sig, SPEC)
    assert s.state.capacity_rps.ceiling == 20.0
    d = s.decide(sig, SPEC, now=600.0)
    assert d.target_serving > 4 and d.reason is ScaleReason.QUEUE_GROWING


@settings(max_examples=200, deadline=None)
@given(
    backlog=st.integers(0, 200),
    fewer=st.integers(0, 200),
    p90=st.floats(0.0, 3.0),
    served=st.floats(0.1, 200.0),
    comfort=st.floats(0.05, 0.95),
)
def test_queue_within_slo_is_monotone_and_keeps_its_margins(
    backlog: int, fewer: int, p90: float, served: float, comfort: float
) -> None:
    """A backlog judged served within the SLO stays so with fewer waiting; when judged so, the p90
    is within comfort x SLO and Little's-law wait within the rest of the SLO."""
    p = TokenplaneParams(comfort_fraction=comfort, latency_queues=True)

    def ok(waiting: int) -> bool:
        sig = PoolSignal(
            now=100.0,
            serving=(InstanceView("i0", running=4, waiting=waiting),),
            throughput_rps=served,
            ttft_p90_s=p90,
            ttft_attainment=1.0,
        )
        return queue_within_slo(sig, SPEC, p)

    if ok(backlog):
        assert ok(min(backlog, fewer))
        assert p90 <= comfort * 1.0
        assert backlog / served <= (1.0 - comfort) * 1.0 + 1e-12


def test_a_quiet_pool_keeps_its_remembered_burst_at_the_rate_served_comfortably() -> None:
    """Bursts of 80 req/s from 0.5 req/s served comfortably by 4 instances (20 each), then the
    quiet level drifts to 0.1 req/s, where the bursts' rise ratio times today's level says a fifth
    of a burst. The probe has raised the estimate above 20; the pool still keeps the 4 instances
    the remembered bursts need at 20 each (a shed instance takes a cold start to return)."""
    rates = ([0.5] * 12 + [80.0] * 10) * 3 + [0.5] * 12 + [0.1] * 40
    s = TokenplaneScaler(
        TokenplaneParams(
            latency_queues=True,
            symmetric_bursts=True,
            window_from_cold_start=True,
            burst_half_life_s=1800.0,
            **SUITE,  # type: ignore[arg-type]
        )
    )
    n = 4
    for k in range(8, len(rates) + 1):
        now = k * BUCKET
        sig = signal(now, rates[:k], n, throughput_rps=rates[k - 1], ttft_p90_s=0.15, ttft_attainment=1.0)
        s.observe(sig, SPEC)
        d = s.decide(sig, SPEC, now=now)
        s.commit(d, now=now)
        if k > 8 + 22:  # one burst learned
            assert d.target_serving >= 4, (now, d.note)
    assert s.capacity_rps(SPEC) > 20.0  # the probe moved the estimate; the floor did not follow it


def test_a_comfortable_pool_does_not_prewarm_on_a_trend_at_a_burst_onset() -> None:
    """A step to 80 req/s met by 4 instances at p90 0.13 s with a capacity estimate the served
    rate has only bounded from below (no ceiling): the Holt trend over a cold start extrapolates
    the step far past 80, but the latency says the pool serves it, so the warm pool is sized from
    measured cold-start rises only (none yet here) and nothing is pre-warmed. Without the rule the
    demand hold is off (the estimate covers the demand) and the trend buys a warm instance."""
    rates = [2.0] * 12 + [40.0, 80.0]
    kw = {"throughput_rps": 60.0, "ttft_p90_s": 0.13, "ttft_attainment": 1.0}
    fitted = PoolSpec(
        min_instances=1,
        max_instances=16,
        cold_start_s=68.0,
        warm_activation_s=5.0,
        capacity_rps=24.0,  # covers the step on 4 at the activation horizon, not the cold trend
        ttft_slo_s=1.0,
    )
    on = TokenplaneScaler(TokenplaneParams(latency_queues=True, learn_burstiness=False, **SUITE))  # type: ignore[arg-type]
    off = TokenplaneScaler(TokenplaneParams(learn_burstiness=False, **SUITE))  # type: ignore[arg-type]
    now = len(rates) * BUCKET
    d_on = on.decide(signal(now, rates, 4, **kw), fitted, now=now)
    d_off = off.decide(signal(now, rates, 4, **kw), fitted, now=now)
    assert d_off.target_serving == 4 and d_off.target_warm >= 1
    assert d_on.target_serving == 4 and d_on.target_warm == 0


@pytest.mark.parametrize(("saturated_rps", "held"), [(24.0, True), (100.0, False)])
def test_a_ceiling_the_pool_has_since_served_past_comfortably_is_refuted(
    saturated_rps: float, held: bool
) -> None:
    """Four instances once queued past the SLO at ``saturated_rps`` (a capacity ceiling), then
    served 80 req/s (20 each) with TTFT p90 at 0.15 s. A ceiling of 6 each is refuted by those 20:
    the estimate is unproven again, so a rising forecast adds no instance while latency is
    comfortable (trust_latency's hold). A ceiling of 25 each still stands: the rise is planned for."""
    params = TokenplaneParams(latency_queues=True, learn_burstiness=False, burst_k=0.0, **SUITE)  # type: ignore[arg-type]
    s = TokenplaneScaler(params)
    flat = [80.0] * 20
    s.observe(
        signal(300.0, flat, 4, waiting=3, throughput_rps=saturated_rps, ttft_p90_s=1.5, ttft_attainment=0.8),
        SPEC,
    )
    assert s.state.capacity_rps.ceiling == saturated_rps / 4
    calm = {"throughput_rps": 80.0, "ttft_p90_s": 0.15, "ttft_attainment": 1.0}
    for k in range(1, 5):
        s.observe(signal(300.0 + k * BUCKET, flat, 4, **calm), SPEC)
    assert s.state.safe_rps == 20.0
    rising = [*flat, 90.0, 100.0, 110.0]
    now = 400.0
    d = s.decide(signal(now, rising, 4, **calm), SPEC, now=now)
    assert d.needs is not None
    assert (d.target_serving == 4) is held
    assert d.needs.demand == (4 if held else d.target_serving) and d.target_serving >= 4
