"""The ``slo_budget`` evidence rule (:mod:`tokenplane.core.autoscale.budget`): the run's banked SLO
margin pays for running one instance short, only at a size measured at the load now or more, priced
by the worst window that size was measured at near the load now (not at a burst far above it), and
the measured terms (SLO) still bring capacity back."""

from __future__ import annotations

import msgspec
import pytest
from autoscale_state import BUDGET_RULES, scaler_in_state
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.autoscale import PoolSignal, PoolSpec, ScaleReason, TokenplaneScaler
from tokenplane.core.autoscale.budget import (
    SizeRecord,
    SloBudget,
    affordable_size,
    band,
    carried,
    held_by_budget,
    load,
    observe_budget,
    recent_rate,
)
from tokenplane.core.autoscale.burst import BurstMemory, RiseSample
from tokenplane.core.autoscale.signals import prompt_tokens_rate
from tokenplane.core.views import InstanceView

SPEC = PoolSpec(max_instances=24, capacity_rps=2.0, cold_start_s=60.0, warm_activation_s=5.0, ttft_slo_s=5.0)
RULES = BUDGET_RULES


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
    st.lists(st.tuples(st.booleans(), st.integers(-10, 160), st.floats(0.0, 1.0)), max_size=6).map(tuple),
    met=st.floats(0.0, 1e4),
    seen=st.floats(0.0, 1e4),
)


@st.composite
def budgets_now(draw: st.DrawFn) -> tuple[SloBudget, int, PoolSignal]:
    """A budget, a pool size and the pool's signal now: what the affordability properties read."""
    sizes = draw(st.lists(records, max_size=6, unique_by=lambda r: r.size))
    budget = SloBudget(draw(st.floats(0.0, 1e5)), draw(st.floats(0.0, 1e5)), tuple(sizes))
    n, rate = draw(st.integers(1, 13)), draw(st.floats(0.1, 100.0))
    return budget, n, pool(n, rate=rate, tokens=draw(st.none() | st.floats(0.0, 1e6)), attainment=1.0)


@settings(max_examples=300, deadline=None)
@given(case=budgets_now(), horizon=st.floats(1.0, 900.0))
def test_only_a_size_measured_at_this_load_and_paid_for_is_afforded(
    case: tuple[SloBudget, int, PoolSignal], horizon: float
) -> None:
    budget, n, signal = case
    size = affordable_size(budget, n, signal, target=0.95, horizon_s=horizon)
    if size is None:
        return
    assert size in (n - 1, n) and size >= 1
    rec = budget.record(size)
    assert rec is not None and carried(rec, signal)
    tokens = signal.prompt_tokens_per_s
    if tokens is None:
        assert rec.max_rps >= recent_rate(signal)
    else:  # like with like: a record never measured in prompt tokens/s is not afforded on them
        assert rec.max_prompt_tps is not None and rec.max_prompt_tps >= tokens
    bank = budget.banked(0.95)
    assert (
        bank > 0
        and bank >= (0.95 - rec.worst_at(signal, load(signal))) * recent_rate(signal) * horizon - 1e-9
    )


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
    assert budget.record(7) == SizeRecord(7, 0.9, 14.0, None, ((False, band(14.0), 0.9),), 0.9 * 210.0, 210.0)


def scaler_with(budget: SloBudget) -> TokenplaneScaler:
    # A learned capacity of 1.9 req/s per instance: the estimate alone keeps 8 for 14.5 req/s.
    return scaler_in_state(RULES, budget, capacity_rps=1.9)


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


@settings(max_examples=200, deadline=None)
@given(
    windows=st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(0.5, 50.0)), min_size=1, max_size=30),
    tokens=st.booleans(),
    probe=st.floats(0.5, 60.0),
)
def test_a_record_keeps_the_worst_window_per_load_band_and_prices_by_the_band_now(
    windows: list[tuple[float, float]], tokens: bool, probe: float
) -> None:
    """Per band of the load (in its unit), the worst settled window; the price at a load is never
    better than the worst window of its band (when measured), nor worse than the worst ever."""
    budget = SloBudget()
    for k, (att, rate) in enumerate(windows):
        signal = pool(3, rate=rate, tokens=rate * 1000.0 if tokens else None, attainment=att, now=90.0 * k)
        budget = observe_budget(budget, signal, SPEC, interval_s=15.0)
    settled = windows[1:]  # the first signal starts the size's clock
    rec = budget.record(3)
    if not settled:
        assert rec is None
        return
    assert rec is not None
    scale = 1000.0 if tokens else 1.0
    for _, key, worst in rec.bands:
        assert worst == min(a for a, r in settled if band(r * scale) == key)
    assert rec.worst_attainment == min(w for _, _, w in rec.bands) == min(a for a, _ in settled)
    signal = pool(3, rate=probe, tokens=probe * 1000.0 if tokens else None, attainment=1.0)
    price = rec.worst_at(signal, load(signal))
    assert price >= rec.worst_attainment
    here = [a for a, r in settled if band(r * scale) == band(probe * scale)]
    if here:
        assert price == min(here)


def test_a_miss_at_a_burst_far_above_the_load_now_does_not_price_the_load_now() -> None:
    """Size 5 served 4.5k prompt tokens/s at 0.99 and missed (0.63) in a burst at 6.5k: back at
    4.5k, going 6 -> 5 costs the window measured there, which a small bank covers; at the burst's
    load it costs the miss (0.32 x 6.3 req/s x 145 s = 292 requests), which that bank does not."""
    five = SizeRecord(5, 0.63, 6.8, 6_500.0, ((True, band(4_500.0), 0.99), (True, band(6_500.0), 0.63)))
    six = SizeRecord(6, 1.0, 6.7, 7_400.0, ((True, band(6_500.0), 1.0),))
    budget = SloBudget(met=9_530.0, seen=10_000.0, sizes=(five, six))  # 30 requests banked
    quiet = pool(6, rate=4.3, tokens=4_500.0, attainment=1.0)
    assert affordable_size(budget, 6, quiet, target=0.95, horizon_s=145.0) == 5
    # The worst ever (the old price, 0.32 x 4.3 x 145 = 200 requests) would not have afforded it.
    assert (0.95 - five.worst_attainment) * 4.3 * 145.0 > budget.banked(0.95)
    burst = pool(6, rate=6.3, tokens=6_500.0, attainment=1.0)
    assert affordable_size(budget, 6, burst, target=0.95, horizon_s=145.0) == 6
    # Above every load 5 was measured at: not carried, not afforded, whatever the bank.
    beyond = pool(6, rate=6.3, tokens=7_000.0, attainment=1.0)
    assert affordable_size(budget, 6, beyond, target=0.95, horizon_s=145.0) == 6


def test_the_afforded_size_caps_the_warm_pool_the_remembered_bursts_ask_for() -> None:
    """While the budget affords 7, serving and warm together stay at 7: a burst memory asking for
    more within a cold start is an estimate, capped like the demand term (the SLO and KV terms,
    measured, are not)."""
    seven = SizeRecord(7, 0.97, 14.5, 160_000.0)
    rich = SloBudget(met=9_700.0, seen=10_000.0, sizes=(seven,))
    scaler = scaler_with(rich)
    state = scaler.state
    bursts = BurstMemory((RiseSample(900.0, 14.5, 20.0),), 1800.0)
    scaler._state = msgspec.structs.replace(
        state,
        burst_cold=bursts,
        capacity_rps=msgspec.structs.replace(state.capacity_rps, ceiling=None),
    )
    decision = scaler.decide(pool(8, rate=14.5, tokens=150_000.0, attainment=0.97), SPEC, now=1000.0)
    assert decision.target_serving == 7 and decision.target_warm == 0
    unafforded = scaler_with(SloBudget())
    unafforded._state = msgspec.structs.replace(scaler.state, slo_budget=SloBudget())
    decision = unafforded.decide(pool(8, rate=14.5, tokens=150_000.0, attainment=0.97), SPEC, now=1000.0)
    assert decision.target_serving + decision.target_warm > 8  # the burst memory, uncapped


def test_the_size_above_earns_back_over_the_rest_of_the_period() -> None:
    """Behind the target (bank -30 requests), 8 -> 7 is afforded only when the SLO is judged over a
    period and 8, measured at this load at 0.98 on average, will earn the cost of 7's worst window
    back before it ends: 0.03 x 14.5 x (600 - 75) = 228 requests cover 0.05 x 14.5 x 75 = 54 + 30."""
    seven = SizeRecord(7, 0.90, 14.5, 160_000.0)
    eight = SizeRecord(8, 0.96, 14.5, 160_000.0, met=980.0, seen=1000.0)
    behind = SloBudget(met=9_470.0, seen=10_000.0, sizes=(seven, eight))
    at_eight = pool(8, rate=14.5, tokens=150_000.0, attainment=0.97)
    assert affordable_size(behind, 8, at_eight, target=0.95, horizon_s=75.0) is None
    assert affordable_size(behind, 8, at_eight, target=0.95, horizon_s=75.0, remaining_s=600.0) == 7
    # Too little of the period left to earn it back: 0.03 x 14.5 x (200 - 75) = 54 < 84.
    assert affordable_size(behind, 8, at_eight, target=0.95, horizon_s=75.0, remaining_s=200.0) is None
    # The size above earns nothing at a load it was not measured at, nor when it is under the target.
    heavier = pool(8, rate=14.5, tokens=170_000.0, attainment=0.97)
    assert affordable_size(behind, 8, heavier, target=0.95, horizon_s=75.0, remaining_s=600.0) is None
    short = msgspec.structs.replace(eight, met=940.0)
    poor = msgspec.structs.replace(behind, sizes=(seven, short))
    assert affordable_size(poor, 8, at_eight, target=0.95, horizon_s=75.0, remaining_s=600.0) is None
    # Through the scaler: the period comes from the params and the clock (now 1000 in a 1600 s period).
    periodic = scaler_with(behind)
    periodic.params = msgspec.structs.replace(RULES, slo_period_s=1600.0)
    assert scaler_with(behind).decide(at_eight, SPEC, now=1000.0).target_serving == 8
    assert periodic.decide(at_eight, SPEC, now=1000.0).target_serving == 7


@settings(max_examples=300, deadline=None)
@given(case=budgets_now(), remaining=st.floats(0.0, 7200.0))
def test_a_period_only_adds_what_a_measured_size_above_earns(
    case: tuple[SloBudget, int, PoolSignal], remaining: float
) -> None:
    """With a period, every size afforded without one still is; a size afforded only with it has a
    size above measured at the load now whose mean attainment beats the target, and the bank plus
    that size's earnings over the rest of the period (after the horizon) pay for the horizon."""
    budget, n, signal = case
    bare = affordable_size(budget, n, signal, target=0.95, horizon_s=75.0)
    size = affordable_size(budget, n, signal, target=0.95, horizon_s=75.0, remaining_s=remaining)
    if bare is not None:
        assert size is not None and size <= bare
    if size is None or size == bare:
        return
    rec, above = budget.record(size), budget.record(size + 1)
    assert rec is not None and carried(rec, signal)
    assert above is not None and carried(above, signal) and remaining > 75.0
    mean = above.mean_attainment()
    assert mean is not None and mean > 0.95
    earned = (mean - 0.95) * recent_rate(signal) * (remaining - 75.0)
    cost = (0.95 - rec.worst_at(signal, load(signal))) * recent_rate(signal) * 75.0
    assert budget.banked(0.95) + earned > 0 and budget.banked(0.95) + earned >= cost - 1e-6


def test_the_bank_starts_again_with_each_period_and_the_records_carry_over() -> None:
    budget = SloBudget()
    for t in (0.0, 90.0, 180.0):
        signal = pool(4, rate=10.0, tokens=None, attainment=0.9, now=t)
        budget = observe_budget(budget, signal, SPEC, interval_s=15.0, period_s=200.0)
    assert budget.seen == pytest.approx(3 * 150.0) and budget.period == 0
    nxt = observe_budget(
        budget,
        pool(4, rate=10.0, tokens=None, attainment=1.0, now=210.0),
        SPEC,
        interval_s=15.0,
        period_s=200.0,
    )
    assert nxt.period == 1 and nxt.seen == pytest.approx(150.0) and nxt.met == pytest.approx(150.0)
    four = nxt.record(4)
    assert four is not None and four.worst_attainment == 0.9 and four.seen == pytest.approx(3 * 150.0)
    # Without a period the bank runs on.
    whole = SloBudget()
    for t in (0.0, 90.0, 180.0, 210.0):
        whole = observe_budget(
            whole, pool(4, rate=10.0, tokens=None, attainment=1.0, now=t), SPEC, interval_s=15.0
        )
    assert whole.seen == pytest.approx(4 * 150.0) and whole.period is None
