"""Invariants for arbitrary signals: bounds, a reason always, cold starts within max, pure decide."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.autoscale import (
    ActionKind,
    Autoscaler,
    HpaScaler,
    PoolSignal,
    PoolSpec,
    ScaleDecision,
    ScaleReason,
    StaticFleet,
    TokenplaneParams,
    TokenplaneScaler,
)
from tokenplane.core.views import InstanceView

# The suite's configuration: every evidence rule on (bench/autoscale_suite.py).
EVIDENCE = TokenplaneParams(
    target_utilisation=1.0,
    symmetric_bursts=True,
    queue_buffer=True,
    window_from_cold_start=True,
    capacity_lower_bounds=True,
    trust_latency=True,
    latency_queues=True,
    warm_slo_share=True,
    cancel_warming=True,
    slo_budget=True,
    slo_defer=True,
    slo_period_s=3600.0,  # the suite passes each run's length; slo_defer reads nothing without one
)

fractions = st.floats(0.0, 1.0, allow_nan=False)
rates = st.floats(0.0, 500.0, allow_nan=False)


@st.composite
def specs(draw: st.DrawFn) -> PoolSpec:
    lo = draw(st.integers(0, 6))
    return PoolSpec(
        min_instances=lo,
        max_instances=draw(st.integers(max(1, lo), 40)),
        warm_pool_size=draw(st.integers(0, 5)),
        cold_start_s=draw(st.floats(0.0, 900.0)),
        warm_activation_s=draw(st.floats(0.0, 30.0)),
        capacity_rps=draw(st.floats(0.05, 50.0)),
        capacity_tokens_per_s=draw(st.none() | st.floats(1.0, 1e5)),
        ttft_slo_s=draw(st.none() | st.floats(0.1, 30.0)),
    )


@st.composite
def signals(draw: st.DrawFn) -> PoolSignal:
    n = draw(st.integers(0, 45))
    serving = tuple(
        InstanceView(
            f"i{k}",
            ready=draw(st.booleans()),
            running=draw(st.integers(0, 300)),
            waiting=draw(st.integers(0, 500)),
            kv_usage=draw(fractions),
        )
        for k in range(n)
    )
    buckets = draw(st.integers(0, 40))
    bucket_s = draw(st.sampled_from([1.0, 10.0, 15.0, 60.0]))
    return PoolSignal(
        now=0.0,
        serving=serving,
        warm=tuple(f"w{k}" for k in range(draw(st.integers(0, 8)))),
        warming=tuple(f"c{k}" for k in range(draw(st.integers(0, 8)))),
        draining=tuple(f"d{k}" for k in range(draw(st.integers(0, 4)))),
        queued=draw(st.integers(0, 2000)),
        arrivals=tuple((i * bucket_s, draw(rates)) for i in range(buckets)),
        tokens_per_s_demand=draw(st.none() | st.floats(0.0, 1e6)),
        throughput_rps=draw(st.none() | rates),
        throughput_tps=draw(st.none() | st.floats(0.0, 1e6)),
        ttft_attainment=draw(st.none() | fractions),
        tbt_attainment=draw(st.none() | fractions),
        ttft_p90_s=draw(st.none() | st.floats(0.0, 100.0)),
        utilisation=draw(st.none() | st.floats(0.0, 2.0)),
    )


def scalers(draw: st.DrawFn) -> Autoscaler:
    return draw(
        st.sampled_from(["tokenplane", "tokenplane-evidence", "hpa", "static"]).map(
            lambda name: {
                "tokenplane": TokenplaneScaler(),
                "tokenplane-evidence": TokenplaneScaler(EVIDENCE),
                "hpa": HpaScaler(),
                "static": StaticFleet(7),
            }[name]
        )
    )


def check(decision: ScaleDecision, signal: PoolSignal, spec: PoolSpec) -> None:
    assert spec.min_instances <= decision.target_serving <= spec.max_instances
    assert decision.target_warm >= 0
    assert decision.target_serving + decision.target_warm <= spec.max_instances
    assert isinstance(decision.reason, ScaleReason)
    assert decision.actions
    headroom = max(0, spec.max_instances - signal.total_instances)
    assert 0 <= decision.cold_starts <= headroom
    assert 0 <= decision.activations <= len(signal.warm)
    assert 0 <= decision.warm_stopped <= len(signal.warm)
    drained = decision.drained
    assert len(set(drained)) == len(drained)
    assert set(drained) <= {v.instance_id for v in signal.serving}
    kinds = {a.kind for a in decision.actions}
    assert not (ActionKind.ACTIVATE_WARM in kinds and drained)  # never both directions at once
    assert not (ActionKind.START_COLD in kinds and ActionKind.STOP_WARM in kinds)
    assert 0 <= decision.warming_cancelled <= len(signal.warming)
    assert not (ActionKind.START_COLD in kinds and ActionKind.CANCEL_WARMING in kinds)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), spec=specs(), first=signals(), second=signals(), dt=st.floats(0.0, 1000.0))
def test_decisions_are_bounded_reasoned_and_pure(
    data: st.DataObject, spec: PoolSpec, first: PoolSignal, second: PoolSignal, dt: float
) -> None:
    scaler = data.draw(st.composite(lambda draw: scalers(draw))())
    # Some history first, so cooldown and stabilisation paths are exercised.
    scaler.observe(first, spec)
    earlier = scaler.decide(first, spec, now=0.0)
    check(earlier, first, spec)
    scaler.commit(earlier, now=0.0)
    scaler.observe(second, spec)

    before = copy.deepcopy(scaler.state)
    one = scaler.decide(second, spec, now=dt)
    two = scaler.decide(second, spec, now=dt)
    assert one == two
    assert scaler.state == before
    check(one, second, spec)
