"""HPA-style scaler against hand-computed numbers, and the static fleet."""

from __future__ import annotations

import pytest

from tokenplane.core.autoscale import ActionKind, HpaScaler, PoolSignal, PoolSpec, ScaleReason, StaticFleet
from tokenplane.core.views import InstanceView

SPEC = PoolSpec(min_instances=1, max_instances=20, warm_pool_size=2, cold_start_s=120.0, capacity_rps=2.0)


def sig(serving: int, util: float | None, *, warm: int = 0, warming: int = 0, now: float = 0.0) -> PoolSignal:
    return PoolSignal(
        now=now,
        serving=tuple(InstanceView(f"i{k}", running=k) for k in range(serving)),
        warm=tuple(f"w{k}" for k in range(warm)),
        warming=tuple(f"c{k}" for k in range(warming)),
        utilisation=util,
    )


@pytest.mark.parametrize(
    ("serving", "util", "target", "reason", "cold", "drained"),
    [
        # desired = ceil(4 × 0.9 / 0.6) = ceil(6.0) = 6: two cold starts (no warm pool)
        (4, 0.9, 6, ScaleReason.UTILISATION_HIGH, 2, 0),
        # 0.65 / 0.6 = 1.083: within the 0.1 tolerance
        (4, 0.65, 4, ScaleReason.WITHIN_TOLERANCE, 0, 0),
        # 0.55 / 0.6 = 0.917: within tolerance
        (4, 0.55, 4, ScaleReason.WITHIN_TOLERANCE, 0, 0),
        # 0.67 / 0.6 = 1.117: outside; ceil(4 × 1.117) = 5
        (4, 0.67, 5, ScaleReason.UTILISATION_HIGH, 1, 0),
        # 0.3 / 0.6 = 0.5: desired 2, no stabilisation history yet: drain 2
        (4, 0.3, 2, ScaleReason.UTILISATION_LOW, 0, 2),
        # scale-up limit: ratio 20 on 1 replica → 20, limited to max(2 × 1, 1 + 4) = 5
        (1, 12.0, 5, ScaleReason.UTILISATION_HIGH, 4, 0),
        # never below min
        (1, 0.01, 1, ScaleReason.AT_MIN, 0, 0),
        # never above max: ceil(10 × 1.0 / 0.3) = 34 → 20, limited to 20 (2 × 10)
        (10, 1.0, 20, ScaleReason.AT_MAX, 10, 0),
        # no metric: hold
        (3, None, 3, ScaleReason.WITHIN_TOLERANCE, 0, 0),
    ],
)
def test_hpa_formula(
    serving: int, util: float | None, target: int, reason: ScaleReason, cold: int, drained: int
) -> None:
    hpa = HpaScaler(target_utilisation=0.3 if util == 1.0 else 0.6)
    decision = hpa.decide(sig(serving, util), SPEC, now=0.0)
    assert (decision.target_serving, decision.reason) == (target, reason), decision
    assert decision.cold_starts == cold
    assert len(decision.drained) == drained
    assert decision.activations == 0 and decision.target_warm == 0


def test_hpa_scale_down_stabilisation_window() -> None:
    hpa = HpaScaler(target_utilisation=0.6)
    timeline = [
        # (now, util, expected target); replicas stay 4 until the window lets go
        (0.0, 0.6, 4),  # within tolerance: recommends 4
        (100.0, 0.45, 4),  # 0.75 → 3, but max(3, 4 @ t=0) = 4
        (200.0, 0.3, 4),  # 0.5 → 2, window holds 4 @ t=0
        (350.0, 0.3, 3),  # window (50, 350]: 3 @ 100, 2 @ 200, 2 now → 3
        (550.0, 0.3, 2),  # window (250, 550]: 2 @ 350 (recommendations, not targets), 2 now → 2
    ]
    for now, util, expected in timeline:
        decision = hpa.decide(sig(4, util, now=now), SPEC, now=now)
        assert decision.target_serving == expected, (now, decision)
        if expected == 4 and now > 0:
            assert decision.reason is ScaleReason.COOLDOWN
        hpa.commit(decision, now=now)
    assert [r for _, r in hpa.state.recommendations] == [2, 2]


def test_hpa_counts_starting_pods_as_replicas() -> None:
    hpa = HpaScaler(target_utilisation=0.6)
    # 2 ready at 0.9 → ceil(2 × 1.5) = 3 < 4 replicas (2 still warming): the HPA does not scale.
    decision = hpa.decide(sig(2, 0.9, warming=2), SPEC, now=0.0)
    assert decision.cold_starts == 0 and not decision.drained
    # at 1.5 → ceil(2 × 2.5) = 5 > 4: one more cold start
    decision = hpa.decide(sig(2, 1.5, warming=2), SPEC, now=0.0)
    assert decision.cold_starts == 1


def test_hpa_activates_landed_pods() -> None:
    decision = HpaScaler(target_utilisation=0.6).decide(sig(2, 0.6, warm=2), SPEC, now=0.0)
    assert decision.activations == 2 and decision.cold_starts == 0


def test_static_fleet() -> None:
    fleet = StaticFleet(5)
    empty = fleet.decide(sig(0, None), SPEC, now=0.0)
    assert empty.target_serving == 5 and empty.cold_starts == 5 and empty.reason is ScaleReason.FIXED_SIZE
    landed = fleet.decide(sig(2, 0.9, warm=3), SPEC, now=0.0)
    assert landed.activations == 3 and landed.cold_starts == 0
    steady = fleet.decide(sig(5, 1.0), SPEC, now=0.0)
    assert [a.kind for a in steady.actions] == [ActionKind.NOOP]
    assert StaticFleet(50).decide(sig(20, 1.0), SPEC, now=0.0).target_serving == 20  # clamped to max
