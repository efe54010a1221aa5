"""The ``slo_budget`` evidence rule (:mod:`tokenplane.core.autoscale.budget`): the run's banked SLO
margin pays for running one instance short, only at a size measured at the load now or more, and
the measured terms (SLO) still bring capacity back."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.autoscale import PoolSignal, PoolSpec, ScaleReason, TokenplaneParams, TokenplaneScaler
from tokenplane.core.autoscale.budget import (
    SizeRecord,
    SloBudget,
    affordable_size,
    carried,
    held_by_budget,
    observe_budget,
    recent_rate,
)
from tokenplane.core.autoscale.scaler_state import ScalerState
from tokenplane.core.autoscale.signals import prompt_tokens_rate
from tokenplane.core.views import InstanceView

SPEC = PoolSpec(max_instances=24, capacity_rps=2.0, cold_start_s=60.0, warm_activation_s=5.0, ttft_slo_s=5.0)
RULES = TokenplaneParams(
    target_utilisation=1.0,
    capacity_lower_bounds=True,
    trust_latency=True,
    window_from_cold_start=True,
    latency_queues=True,
    slo_budget=True,
)


def pool(n: int, *, rate: float, tokens: float | None, attainment: float, now: float = 1000.0) -> PoolSignal:
    return PoolSignal(
        now=now,
        serving=tuple(InstanceView(f"i{k}", running=8) for k in range(n)),
        arrivals=tuple((now - 60.0 + 15.0 * k, rate) for k in range(4)),
        prompt_tokens_per_s=tokens,
        throughput_rps=rate,
        ttft_attainment=attainment,
        ttft_p90_s=2.0,
    )


records = st.builds(
    SizeRecord,
    st.integers(1, 12),
    st.floats(0.0, 1.0),
    st.floats(0.0, 100.0),
    st.none() | st.floats(0.0, 1e6),
)


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(records, max_size=6, unique_by=lambda r: r.size),
    met=st.floats(0.0, 1e5),
    seen=st.floats(0.0, 1e5),
    n=st.integers(1, 13),
    rate=st.floats(0.1, 100.0),
    tokens=st.none() | st.floats(0.0, 1e6),
    horizon=st.floats(1.0, 900.0),
)
def test_only_a_size_measured_at_this_load_and_paid_for_is_afforded(
    sizes: list[SizeRecord],
    met: float,
    seen: float,
    n: int,
    rate: float,
    tokens: float | None,
    horizon: float,
) -> None:
    budget = SloBudget(met, seen, tuple(sizes))
    signal = pool(n, rate=rate, tokens=tokens, attainment=1.0)
    size = affordable_size(budget, n, signal, target=0.95, horizon_s=horizon)
    if size is None:
        return
    assert size in (n - 1, n) and size >= 1
    rec = budget.record(size)
    assert rec is not None and carried(rec, signal)
    if tokens is None:
        assert rec.max_rps >= recent_rate(signal)
    else:  # like with like: a record never measured in prompt tokens/s is not afforded on them
        assert rec.max_prompt_tps is not None and rec.max_prompt_tps >= tokens
    bank = budget.banked(0.95)
    assert bank > 0 and bank >= (0.95 - rec.worst_attainment) * rate * horizon - 1e-9


@settings(max_examples=200, deadline=None)
@given(windows=st.lists(st.tuples(st.integers(1, 4), st.floats(0.0, 1.0), st.floats(0.1, 50.0)), max_size=40))
def test_the_bank_is_the_served_weighted_attainment_and_records_keep_the_worst(
    windows: list[tuple[int, float, float]],
) -> None:
    budget, met, seen = SloBudget(), 0.0, 0.0
    for k, (n, att, rate) in enumerate(windows):
        budget = observe_budget(
            budget, pool(n, rate=rate, tokens=None, attainment=att, now=100.0 * k), SPEC, interval_s=15.0
        )
        met, seen = met + att * rate * 15.0, seen + rate * 15.0
    assert abs(budget.met - met) <= 1e-6 * max(1.0, met) and abs(budget.seen - seen) <= 1e-6 * max(1.0, seen)
    for rec in budget.sizes:  # only windows after the size held for a cold start + SLO + a decision
        measured = [a for j, (n, a, _) in enumerate(windows) if n == rec.size]
        assert measured and rec.worst_attainment >= min(measured)


def test_a_size_is_not_recorded_before_it_has_settled() -> None:
    budget = SloBudget()
    for t in (0.0, 15.0, 30.0, 45.0, 60.0, 75.0):  # settled after 60 + 5 + 15 = 80 s
        budget = observe_budget(
            budget, pool(7, rate=14.0, tokens=None, attainment=0.5, now=t), SPEC, interval_s=15.0
        )
    assert budget.record(7) is None
    budget = observe_budget(
        budget, pool(7, rate=14.0, tokens=None, attainment=0.9, now=90.0), SPEC, interval_s=15.0
    )
    assert budget.record(7) == SizeRecord(7, 0.9, 14.0, None)


def scaler_with(budget: SloBudget) -> TokenplaneScaler:
    scaler = TokenplaneScaler(RULES)
    # A learned capacity of 1.9 req/s per instance: the estimate alone keeps 8 for 14.5 req/s.
    state = ScalerState(first_decision_s=0.0, slo_budget=budget)
    scaler._state = msgspec.structs.replace(  # the state a run would have reached; decide reads it
        state,
        capacity_rps=msgspec.structs.replace(
            state.capacity_rps, value=1.9, observations=5, weight=5.0, ceiling=1.9
        ),
    )
    return scaler


def test_a_banked_margin_pays_for_one_instance_fewer_and_a_failing_window_brings_it_back() -> None:
    seven = SizeRecord(7, 0.90, 14.5, 160_000.0)
    rich = SloBudget(met=9_700.0, seen=10_000.0, sizes=(seven,))  # 200 requests banked
    at_eight = pool(8, rate=14.5, tokens=150_000.0, attainment=0.97)
    assert scaler_with(SloBudget()).decide(at_eight, SPEC, now=1000.0).target_serving == 8  # no bank
    assert scaler_with(rich).decide(at_eight, SPEC, now=1000.0).target_serving == 7
    # Measured only at a lower load (in prompt tokens/s): not afforded.
    heavier = pool(8, rate=14.5, tokens=170_000.0, attainment=0.97)
    assert scaler_with(rich).decide(heavier, SPEC, now=1000.0).target_serving == 8
    # Not enough banked for the worst window at 7 over a cold start (0.05 x 14.5 x 75 = 54 requests).
    poor = SloBudget(met=9_540.0, seen=10_000.0, sizes=(seven,))
    assert scaler_with(poor).decide(at_eight, SPEC, now=1000.0).target_serving == 8
    # At 7 on the budget, the estimate asking for 8 is capped; a failing SLO window is not.
    at_seven = pool(7, rate=14.5, tokens=150_000.0, attainment=0.97)
    eight = SizeRecord(8, 0.95, 14.5, 160_000.0)
    rich7 = msgspec.structs.replace(rich, sizes=(seven, eight))
    assert scaler_with(SloBudget()).decide(at_seven, SPEC, now=1000.0).target_serving == 8  # no bank
    assert scaler_with(rich7).decide(at_seven, SPEC, now=1000.0).target_serving == 7
    failing = msgspec.structs.replace(at_seven, ttft_attainment=0.8, queued=20)
    decision = scaler_with(rich7).decide(failing, SPEC, now=1000.0)
    assert decision.target_serving > 7 and decision.reason is ScaleReason.SLO_AT_RISK


def settled_at(n: int, *, rate: float, tokens: float | None) -> SloBudget:
    """A budget whose only record is size ``n``, measured (settled) at this load in this unit."""
    budget = SloBudget()
    for t in (0.0, 90.0):
        signal = pool(n, rate=rate, tokens=tokens, attainment=0.97, now=t)
        budget = observe_budget(budget, signal, SPEC, interval_s=15.0)
    return msgspec.structs.replace(budget, met=9_900.0, seen=10_000.0)


def test_a_record_is_compared_with_the_load_now_in_the_same_unit() -> None:
    """A size measured at 160k prompt tokens/s and 10 req/s is not afforded (nor does it hold) at
    14.5 req/s once prompt tokens are not measured, and a size measured at 14.5 req/s before prompt
    tokens were is not at 150k tokens/s: each unit is compared only with itself."""
    in_tokens = settled_at(7, rate=10.0, tokens=160_000.0)
    no_tokens = pool(8, rate=14.5, tokens=None, attainment=0.97)
    assert affordable_size(in_tokens, 8, no_tokens, target=0.95, horizon_s=75.0) is None
    assert not held_by_budget(in_tokens, 6, pool(6, rate=14.5, tokens=None, attainment=0.97))
    assert (
        affordable_size(
            in_tokens, 8, pool(8, rate=9.0, tokens=None, attainment=0.97), target=0.95, horizon_s=75.0
        )
        == 7
    )
    in_rps = settled_at(7, rate=14.5, tokens=None)
    with_tokens = pool(8, rate=10.0, tokens=150_000.0, attainment=0.97)
    assert affordable_size(in_rps, 8, with_tokens, target=0.95, horizon_s=75.0) is None
    assert not held_by_budget(in_rps, 6, pool(6, rate=10.0, tokens=150_000.0, attainment=0.97))
    assert (
        affordable_size(
            in_rps, 8, pool(8, rate=10.0, tokens=None, attainment=0.97), target=0.95, horizon_s=75.0
        )
        == 7
    )


@given(
    tokens=st.dictionaries(st.integers(0, 40), st.integers(0, 10_000), max_size=30),
    now=st.floats(0.0, 500.0),
    width=st.sampled_from([1.0, 5.0, 10.0, 15.0]),
)
def test_prompt_tokens_rate_is_the_mean_of_the_last_minutes_complete_buckets(
    tokens: dict[int, int], now: float, width: float
) -> None:
    """Both shells measure ``prompt_tokens_per_s`` with this one function: the tokens of complete
    buckets within the last minute over their span; ``None`` before a bucket is complete."""
    rate = prompt_tokens_rate(tokens, now, width)
    current = int(now // width)
    if current == 0:
        assert rate is None
        return
    span = [b for b in range(current) if (current - b) * width <= 60.0 or b == current - 1]
    assert rate == pytest.approx(sum(tokens.get(b, 0) for b in span) / (len(span) * width))
