"""The tokenplane scaler, table-driven: each reason, the warm pool, cooldown, hysteresis, bounds."""

from __future__ import annotations

import pytest

from tokenplane.core.autoscale import (
    ActionKind,
    PoolSignal,
    PoolSpec,
    ScaleDecision,
    ScaleReason,
    TokenplaneParams,
    TokenplaneScaler,
)
from tokenplane.core.autoscale.tokenplane_params import read_params
from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.views import InstanceView

SPEC = PoolSpec(
    min_instances=1,
    max_instances=20,
    warm_pool_size=2,
    cold_start_s=120.0,
    warm_activation_s=5.0,
    capacity_rps=2.0,
)
# With these defaults one instance is sized for 2 × 0.75 = 1.5 req/s, and scale-down at 2 × 0.65 = 1.3.


def flat(
    rps: float, buckets: int = 20, bucket_s: float = 15.0, end: float = 0.0
) -> tuple[tuple[float, float], ...]:
    return tuple((end - (buckets - i) * bucket_s, rps) for i in range(buckets))


def views(n: int, *, waiting: int = 0, running: int = 4, kv: float = 0.3) -> tuple[InstanceView, ...]:
    return tuple(
        InstanceView(f"i{k:02d}", running=running + k % 3, waiting=waiting, kv_usage=kv) for k in range(n)
    )


def signal(n: int, *, warm: int = 2, warming: int = 0, arrivals=None, **kw: object) -> PoolSignal:
    return PoolSignal(
        now=0.0,
        serving=views(n, **{k: kw.pop(k) for k in ("waiting", "running", "kv") if k in kw}),  # type: ignore[arg-type]
        warm=tuple(f"w{k}" for k in range(warm)),
        warming=tuple(f"c{k}" for k in range(warming)),
        arrivals=arrivals if arrivals is not None else flat(n * 1.5),
        **kw,  # type: ignore[arg-type]
    )


def kinds(decision: ScaleDecision) -> dict[ActionKind, int]:
    return {a.kind: (a.count if a.count else len(a.instance_ids)) for a in decision.actions}


CASES = [
    # id, signal, expected reason, expected target_serving, expected action counts
    ("steady", signal(4), ScaleReason.STEADY, 4, {ActionKind.NOOP: 0}),
    (
        "queue growing: backlog 40 at 8 req/s served needs ceil((8 + 40/30) / 1.5) = 7",
        signal(4, waiting=10, throughput_rps=8.0, arrivals=flat(6.0)),
        ScaleReason.QUEUE_GROWING,
        7,
        # 2 warm activated at once; 1 more serving + 2 warm to refill come from cold starts
        {ActionKind.ACTIVATE_WARM: 2, ActionKind.START_COLD: 3},
    ),
    (
        "forecast rise activates warm before any queue",
        signal(4, arrivals=tuple((i * 15.0, 2.0 + 0.5 * i) for i in range(10))),
        ScaleReason.FORECAST_RISE,
        None,
        {ActionKind.ACTIVATE_WARM: None, ActionKind.START_COLD: None},
    ),
    (
        "KV pressure: mean 0.96 over 4 needs ceil(4 × 0.96 / 0.75) = 6",
        signal(4, kv=0.96),
        ScaleReason.KV_PRESSURE,
        6,
        {ActionKind.ACTIVATE_WARM: 2, ActionKind.START_COLD: 2},
    ),
    (
        "SLO at risk while loaded: 4 + ceil(4 × 2 × 0.15 / 0.95) = 6",
        signal(4, ttft_attainment=0.80),
        ScaleReason.SLO_AT_RISK,
        6,
        {ActionKind.ACTIVATE_WARM: 2, ActionKind.START_COLD: 2},
    ),
    (
        "bad SLO on an idle pool is not a capacity problem: adds nothing (and may shrink)",
        signal(4, ttft_attainment=0.5, arrivals=flat(0.5)),
        ScaleReason.OVERPROVISIONED,
        3,
        {ActionKind.DRAIN: 1},
    ),
    (
        "at max: huge backlog clamps to 20; cold starts stop at the max total",
        signal(10, waiting=100, throughput_rps=20.0, warm=2, warming=3, arrivals=flat(20.0)),
        ScaleReason.AT_MAX,
        20,
        {ActionKind.ACTIVATE_WARM: 2, ActionKind.START_COLD: 5},
    ),
    (
        "at min: no demand, one serving",
        signal(1, arrivals=flat(0.0)),
        ScaleReason.AT_MIN,
        1,
        {ActionKind.NOOP: 0},
    ),
    (
        "below min: brought up to min",
        signal(0, warm=0, arrivals=()),
        ScaleReason.AT_MIN,
        1,
        {ActionKind.START_COLD: 3},
    ),
    (
        "warm pool backfilled while serving is steady",
        signal(4, warm=0),
        ScaleReason.WARM_BACKFILL,
        4,
        {ActionKind.START_COLD: 2},
    ),
    (
        "warming instances count toward the warm pool",
        signal(4, warm=0, warming=2),
        ScaleReason.STEADY,
        4,
        {ActionKind.NOOP: 0},
    ),
    (
        "excess warm instances are stopped",
        signal(4, warm=5),
        ScaleReason.WARM_BACKFILL,
        4,
        {ActionKind.STOP_WARM: 3},
    ),
]


@pytest.mark.parametrize(
    ("sig", "reason", "target", "actions"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_decisions(
    sig: PoolSignal, reason: ScaleReason, target: int | None, actions: dict[ActionKind, int]
) -> None:
    decision = TokenplaneScaler().decide(sig, SPEC, now=0.0)
    assert decision.reason is reason, decision
    if target is not None:
        assert decision.target_serving == target
    got = kinds(decision)
    assert set(got) == set(actions), decision.actions
    for kind, count in actions.items():
        if count is not None and kind is not ActionKind.NOOP:
            assert got[kind] == count, (kind, decision.actions)


def test_forecast_rise_activates_warm_with_an_empty_queue() -> None:
    sig = signal(4, arrivals=tuple((i * 15.0, 2.0 + 0.5 * i) for i in range(10)))
    assert sig.backlog == 0
    decision = TokenplaneScaler().decide(sig, SPEC, now=0.0)
    assert decision.target_serving > 4
    assert decision.activations == min(2, decision.target_serving - 4)
    assert decision.needs is not None and decision.needs.forecast_rps > 6.5  # last bucket was 6.5


def test_scale_down_waits_for_cooldown_then_drains_least_loaded() -> None:
    scaler = TokenplaneScaler(TokenplaneParams(cooldown_s=180.0, stabilisation_s=300.0))
    up = scaler.decide(signal(6, arrivals=flat(13.5)), SPEC, now=0.0)
    assert up.target_serving == 9  # ceil(13.5 / 1.5); recorded: ceil(13.5 / 1.3) = 11
    scaler.commit(up, now=0.0)

    quiet = signal(8, arrivals=flat(2.0, end=60.0))
    held = scaler.decide(quiet, SPEC, now=60.0)
    assert held.reason is ScaleReason.COOLDOWN
    assert held.target_serving == 8 and not held.drained
    scaler.commit(held, now=60.0)

    # Past the cooldown but the stabilisation window still holds the recommendation of 11.
    still = scaler.decide(quiet, SPEC, now=250.0)
    assert still.reason is ScaleReason.COOLDOWN and not still.drained

    down = scaler.decide(quiet, SPEC, now=400.0)
    assert down.reason is ScaleReason.OVERPROVISIONED
    # At most 25 % of the pool per decision: 8 → 6, draining the two with the least work.
    assert down.target_serving == 6
    assert down.drained == ("i00", "i03")  # running 4 + 0 and 4 + 0 (k % 3 == 0), ids in order
    assert ActionKind.STOP_WARM not in kinds(down)


def test_hysteresis_band_holds_a_pool_just_above_need() -> None:
    # 4 instances at 5.5 req/s: need ceil(5.5/1.5) = 4 to scale up, ceil(5.5/1.3) = 5 > 4... so steady;
    # at 5.0: up-need 4, down-need ceil(5/1.3) = 4: still steady, no drain to 3 + churn.
    for rps in (5.0, 5.5):
        decision = TokenplaneScaler().decide(signal(4, arrivals=flat(rps)), SPEC, now=1000.0)
        assert decision.reason is ScaleReason.STEADY and decision.target_serving == 4
    # 3.0 req/s: down-need ceil(3/1.3) = 3 < 4: drains one (no history, no cooldown).
    decision = TokenplaneScaler().decide(signal(4, arrivals=flat(3.0)), SPEC, now=1000.0)
    assert decision.reason is ScaleReason.OVERPROVISIONED and decision.target_serving == 3


def test_drained_instances_park_in_a_short_warm_pool() -> None:
    decision = TokenplaneScaler().decide(signal(8, warm=0, arrivals=flat(2.0)), SPEC, now=1000.0)
    got = kinds(decision)
    assert got[ActionKind.DRAIN_TO_WARM] == 2
    assert ActionKind.START_COLD not in got  # parked instances refill the pool: no cold start


def test_slo_feedback_steps_once_per_interval() -> None:
    scaler = TokenplaneScaler()
    first = scaler.decide(signal(4, ttft_attainment=0.8), SPEC, now=0.0)
    assert first.reason is ScaleReason.SLO_AT_RISK
    scaler.commit(first, now=0.0)
    # 30 s later attainment (a lagging window) is still low: hold, do not add again, do not drain.
    again = scaler.decide(signal(6, ttft_attainment=0.8, arrivals=flat(6.0)), SPEC, now=30.0)
    assert again.target_serving == 6 and not again.drained
    later = scaler.decide(signal(6, ttft_attainment=0.8, arrivals=flat(6.0)), SPEC, now=61.0)
    assert later.reason is ScaleReason.SLO_AT_RISK and later.target_serving > 6


def test_learned_capacity_changes_sizing() -> None:
    scaler = TokenplaneScaler()
    # Saturated (backlog >= one per instance) at 1 req/s per instance: the prior of 2 was optimistic.
    saturated = signal(4, waiting=3, throughput_rps=4.0, arrivals=flat(4.0))
    for _ in range(20):
        scaler.observe(saturated, SPEC)
    assert scaler.capacity_rps(SPEC) == pytest.approx(1.0, rel=0.05)
    decision = scaler.decide(signal(4, arrivals=flat(4.0)), SPEC, now=0.0)
    assert decision.target_serving == 6  # ceil(4 / (1.0 × 0.75))


def test_params_are_validated() -> None:
    with pytest.raises(ValueError, match="target_utilisation"):
        TokenplaneParams(target_utilisation=1.5)
    with pytest.raises(ValueError, match="kv_target"):
        TokenplaneParams(kv_target=0.95, kv_high=0.9)
    with pytest.raises(ValueError, match="slo_period_s"):
        TokenplaneParams(slo_period_s=0.0)
    assert read_params({"slo_period_s": 3600}).slo_period_s == 3600.0
    with pytest.raises(InvalidPolicyConfig, match="slo_period_s"):
        read_params({"slo_period_s": -1})


def test_a_drained_backlog_is_not_remembered_by_the_stabilisation_window() -> None:
    scaler = TokenplaneScaler(TokenplaneParams(cooldown_s=0.0))
    burst = scaler.decide(signal(6, waiting=20, throughput_rps=9.0, arrivals=flat(9.0)), SPEC, now=0.0)
    assert burst.reason is ScaleReason.QUEUE_GROWING and burst.target_serving == 9  # ceil((9 + 4) / 1.5)
    assert burst.recommendation == 7  # demand alone at the scale-down utilisation: ceil(9 / 1.3)
    scaler.commit(burst, now=0.0)
    after = scaler.decide(signal(9, arrivals=flat(9.0, end=30.0)), SPEC, now=30.0)
    assert after.reason is ScaleReason.OVERPROVISIONED and after.target_serving == 7
