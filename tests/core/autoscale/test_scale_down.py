"""The tokenplane scaler's way down on its own: what a carried-out decision leaves in the state
(record_decision) and how the pool shrinks from it (scale_down): bounds, cooldown, stabilisation
window, step size, and window_from_cold_start's spans."""

from __future__ import annotations

from tokenplane.core.autoscale import PoolSpec, ScaleDecision, ScaleReason, ScalerState, TokenplaneParams
from tokenplane.core.autoscale.scale_down import record_decision, scale_down

SPEC = PoolSpec(max_instances=20, capacity_rps=1.0, min_instances=2, cold_start_s=100.0)
P = TokenplaneParams(cooldown_s=60.0, stabilisation_s=120.0, scale_down_step_fraction=0.25)


def decided(state: ScalerState, now: float, serving: int, target: int, recommendation: int) -> ScalerState:
    d = ScaleDecision(target, 1, ScaleReason.STEADY, current_serving=serving, recommendation=recommendation)
    return record_decision(state, P, d, now=now)


def test_record_decision_keeps_the_window_and_dates_scale_ups_only() -> None:
    s = decided(ScalerState(), 0.0, serving=4, target=6, recommendation=6)  # a scale-up
    assert s.last_scale_up_s == 0.0 and s.first_decision_s == 0.0 and s.last_asked == 7
    s = decided(s, 100.0, serving=6, target=6, recommendation=5)
    s = decided(s, 200.0, serving=6, target=5, recommendation=3)
    assert s.last_scale_up_s == 0.0 and s.first_decision_s == 0.0 and s.last_asked == 6
    # the recommendation at t = 0 is older than stabilisation_s (120 s) at t = 200: dropped
    assert s.recommendations == ((100.0, 5), (200.0, 3))


def test_scale_down_bounds_and_steady() -> None:
    s = ScalerState()
    assert scale_down(s, P, 25, 3, 3, SPEC, 1000.0)[:2] == (20, ScaleReason.AT_MAX)
    assert scale_down(s, P, 1, 0, 0, SPEC, 1000.0)[:2] == (2, ScaleReason.AT_MIN)
    assert scale_down(s, P, 6, 6, 6, SPEC, 1000.0)[:2] == (6, ScaleReason.STEADY)
    assert scale_down(s, P, 2, 2, 1, SPEC, 1000.0)[:2] == (2, ScaleReason.AT_MIN)


def test_cooldown_then_the_window_then_one_step_at_a_time() -> None:
    # a scale-up at t = 0 whose own scale-down recommendation was low: only the cooldown holds
    s = decided(ScalerState(), 0.0, serving=8, target=12, recommendation=4)
    target, reason, note = scale_down(s, P, 12, 4, 4, SPEC, 30.0)
    assert (target, reason) == (12, ScaleReason.COOLDOWN) and "cooldown" in note  # 30 s < 60 s
    s = decided(s, 90.0, serving=12, target=12, recommendation=11)
    # past the cooldown, the window (the last 120 s) holds the largest recommendation: 11
    assert scale_down(s, P, 12, 4, 4, SPEC, 100.0)[:2] == (11, ScaleReason.OVERPROVISIONED)
    s = decided(s, 95.0, serving=12, target=12, recommendation=12)
    target, reason, note = scale_down(s, P, 12, 4, 4, SPEC, 100.0)
    assert (target, reason) == (12, ScaleReason.COOLDOWN) and "stabilisation window" in note
    # once the window has passed: by at most a quarter of the pool per decision
    assert scale_down(s, P, 12, 4, 4, SPEC, 300.0)[:2] == (9, ScaleReason.OVERPROVISIONED)
    assert scale_down(s, P, 3, 2, 2, SPEC, 300.0)[:2] == (2, ScaleReason.OVERPROVISIONED)  # at least 1


def test_window_from_cold_start_waits_one_span_before_any_shrink() -> None:
    p = TokenplaneParams(cooldown_s=60.0, stabilisation_s=120.0, window_from_cold_start=True)
    span = SPEC.cold_start_s + p.decision_interval_s  # 115 s: both cooldown and window
    s = record_decision(ScalerState(), p, ScaleDecision(8, 0, ScaleReason.STEADY, current_serving=8), now=0.0)
    assert scale_down(s, p, 8, 4, 4, SPEC, span - 1)[:2] == (8, ScaleReason.COOLDOWN)
    assert scale_down(s, p, 8, 4, 4, SPEC, span + 1)[:2] == (6, ScaleReason.OVERPROVISIONED)
