"""The ``slo_defer`` rule (:func:`tokenplane.core.autoscale.budget.deferral`): with the SLO judged
over a period, a purchase waits while the period can still end on target if it is made later, the
pool goes one size down only when the bank pays for it, and a lost period gets no opinion."""

from __future__ import annotations

import msgspec
from autoscale_state import BUDGET_RULES, scaler_in_state
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.autoscale import PoolSignal, PoolSpec, TokenplaneParams, TokenplaneScaler
from tokenplane.core.autoscale.budget import NO_OPINION, Deferral, SizeRecord, SloBudget, deferral
from tokenplane.core.views import InstanceView

SPEC = PoolSpec(max_instances=24, capacity_rps=2.0, cold_start_s=60.0, warm_activation_s=5.0, ttft_slo_s=5.0)
HORIZON = 75.0  # a cold start and a decision
RATE = 12.0


def pool(n: int, *, attainment: float | None, kv: float = 0.3, now: float = 600.0) -> PoolSignal:
    return PoolSignal(
        now=now,
        serving=tuple(InstanceView(f"i{k}", running=8, kv_usage=kv) for k in range(n)),
        arrivals=tuple((now - 60.0 + 15.0 * k, RATE) for k in range(4)),
        throughput_rps=RATE,
        ttft_attainment=attainment,
        ttft_p90_s=2.0,
    )


def banked(bank: float, *sizes: SizeRecord, seen: float = 7_200.0) -> SloBudget:
    """A budget ``bank`` requests ahead of 95 % after ``seen`` judged (12 req/s for 600 s)."""
    return SloBudget(met=0.95 * seen + bank, seen=seen, sizes=sizes)


def defer(
    budget: SloBudget, signal: PoolSignal, *, n: int = 7, remaining: float = 1000.0, short: bool = False
) -> Deferral:
    return deferral(
        budget,
        n,
        signal,
        target=0.95,
        horizon_s=HORIZON,
        elapsed_s=600.0,
        remaining_s=remaining,
        interval_s=15.0,
        short_by_estimate=short,
    )


def test_a_pool_that_ends_the_period_on_target_where_it_is_holds() -> None:
    """20 requests behind, a window at 0.96: the rest of the period at this size earns 0.01 x 12 x
    925 = 111 back, so a purchase now would buy nothing the period needs."""
    assert defer(banked(-20.0), pool(7, attainment=0.96)).hold


def test_a_purchase_waits_until_the_latest_time_it_can_still_earn_the_shortfall_back() -> None:
    """At 0.90 (5 points short) an unmeasured size above is assumed to serve every request in time
    (5 points over): with 400 requests behind the latest purchase is (-400 - 45 + 0.05 x 12 x 925) /
    (12 x 0.10) = 92 s away, so it waits; with 500 behind it is 8 s away, under a decision: buy."""
    short = pool(7, attainment=0.90)
    assert defer(banked(-400.0), short).hold
    assert not defer(banked(-500.0), short).hold


def test_a_measured_size_above_earns_its_mean_not_the_prior() -> None:
    """Measured at this load at 0.97 on average, 8 earns 2 points, not 5: 400 behind is then too
    deep to wait for."""
    eight = SizeRecord(8, 0.9, RATE, met=970.0, seen=1000.0)
    assert defer(banked(-400.0), pool(7, attainment=0.90)).hold
    assert not defer(banked(-400.0, eight), pool(7, attainment=0.90)).hold


def test_a_period_no_size_can_bring_back_and_its_last_horizon_get_no_opinion() -> None:
    """A pool serving nothing in time 5,000 requests behind (bursty traffic on one instance): even an
    instance more serving every request in time earns 555 back, so the rule leaves the pool to the
    other rules, as it does in the period's last horizon."""
    assert defer(banked(-5_000.0), pool(1, attainment=0.0), n=1) == NO_OPINION
    assert defer(banked(500.0), pool(7, attainment=0.99), remaining=HORIZON + 10.0) == NO_OPINION


def test_an_unmeasured_size_the_estimate_calls_short_is_not_held_on_its_window() -> None:
    """A pool of one at twice its learned capacity shows 0.98 for its first minute (the window counts
    first tokens; the queue it builds shows later): the window vouches for a size only once the
    size has been measured at this load."""
    fresh = pool(1, attainment=0.98, now=60.0)
    assert defer(banked(30.0), fresh, n=1).hold
    assert not defer(banked(30.0), fresh, n=1, short=True).hold
    one = SizeRecord(1, 0.97, RATE, met=980.0, seen=1000.0)
    assert defer(banked(30.0, one), fresh, n=1, short=True).hold


def test_one_size_down_is_paid_for_by_the_bank() -> None:
    """Never measured at this load, 6 is allowed only when the bank covers a horizon of every request
    missed (0.95 x 12 x 75 = 855); measured at its worst at 0.91 near this load, when the bank covers
    that for a horizon (0.04 x 12 x 75 = 36) less what 7 (at 0.97) earns over the rest."""
    seven = SizeRecord(7, 0.96, RATE, met=970.0, seen=1000.0)
    assert not defer(banked(800.0, seven), pool(7, attainment=0.97)).shrink
    assert defer(banked(900.0, seven), pool(7, attainment=0.97)).shrink
    six = SizeRecord(6, 0.91, RATE)
    assert defer(banked(0.0, six, seven), pool(7, attainment=0.97)).shrink
    # 250 behind: 250 + 36 > 0.02 x 12 x 925 = 222.
    assert not defer(banked(-250.0, six, seven), pool(7, attainment=0.97)).shrink


records = st.builds(
    SizeRecord,
    st.integers(1, 12),
    st.floats(0.0, 1.0),
    st.floats(0.0, 100.0),
    met=st.floats(0.0, 1e4),
    seen=st.floats(0.0, 1e4),
)


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(records, max_size=5, unique_by=lambda r: r.size),
    n=st.integers(1, 12),
    attainment=st.none() | st.floats(0.0, 1.0),
    banks=st.tuples(st.floats(-1e4, 1e4), st.floats(-1e4, 1e4)).map(sorted),
    remaining=st.floats(0.0, 7200.0),
    short=st.booleans(),
)
def test_more_banked_never_buys_sooner_nor_forbids_a_shrink_in_a_period_still_open(
    sizes: list[SizeRecord],
    n: int,
    attainment: float | None,
    banks: list[float],
    remaining: float,
    short: bool,
) -> None:
    signal = pool(n, attainment=attainment)
    low, high = (defer(banked(b, *sizes), signal, n=n, remaining=remaining, short=short) for b in banks)
    assert high.hold or not low.hold
    # A period lost at the lower bank is left to the other rules (no opinion: a shrink allowed).
    assert high.shrink or not low.shrink or low == NO_OPINION


RULES = msgspec.structs.replace(BUDGET_RULES, slo_period_s=1600.0)


def scaler(params: TokenplaneParams, budget: SloBudget) -> TokenplaneScaler:
    return scaler_in_state(params, budget, capacity_rps=2.0)


def test_kv_pressure_on_a_pool_on_course_waits_and_one_behind_goes_one_size_up() -> None:
    """KV use at 0.95 on 7 asks for 9 (7 x 0.95 / 0.75). On course for the period (20 behind, a
    window at 0.96) the deferring scaler holds 7; 5,000 behind, one size up at a time (8)."""
    full = pool(7, attainment=0.96, kv=0.95)
    deferring = msgspec.structs.replace(RULES, slo_defer=True)
    assert scaler(RULES, banked(-20.0)).decide(full, SPEC, now=600.0).target_serving == 9
    assert scaler(deferring, banked(-20.0)).decide(full, SPEC, now=600.0).target_serving == 7
    assert scaler(deferring, banked(-5_000.0)).decide(full, SPEC, now=600.0).target_serving == 8
    # Without a period the rule has nothing to project over: the KV term as before.
    unperiodic = msgspec.structs.replace(deferring, slo_period_s=None)
    assert scaler(unperiodic, banked(-20.0)).decide(full, SPEC, now=600.0).target_serving == 9
