"""The tokenplane scaler's way down: the record of decisions (:func:`record_decision`) and the
rule that shrinks the pool from it (:func:`scale_down`): never within a cooldown of a scale-up, to
the largest recommendation of the stabilisation window, by at most ``scale_down_step_fraction`` of
the pool per decision (step 3 of :mod:`.policy`'s algorithm; ``window_from_cold_start`` in
:mod:`.evidence`).
"""

from __future__ import annotations

import math

import msgspec

from tokenplane.core.autoscale.decision import ScaleDecision, ScaleReason
from tokenplane.core.autoscale.scaler_state import ScalerState
from tokenplane.core.autoscale.signals import PoolSpec
from tokenplane.core.autoscale.tokenplane_params import TokenplaneParams

__all__ = ["record_decision", "scale_down"]


def record_decision(
    state: ScalerState, p: TokenplaneParams, decision: ScaleDecision, *, now: float
) -> ScalerState:
    """The state after a decision that the shell carried out: cooldown clock and stabilisation window."""
    # Kept for the longest window decide() may read (window_from_cold_start: a cold start).
    horizon = now - (max(p.stabilisation_s, 3600.0) if p.window_from_cold_start else p.stabilisation_s)
    recs = tuple(r for r in state.recommendations if r[0] > horizon and r[0] <= now)
    last_up = state.last_scale_up_s
    if decision.target_serving > decision.current_serving:
        last_up = now
    first = state.first_decision_s
    return msgspec.structs.replace(
        state,
        recommendations=(*recs, (now, decision.recommendation)),
        last_scale_up_s=last_up,
        first_decision_s=now if first is None else first,
        last_asked=decision.target_serving + decision.target_warm,
    )


def scale_down(
    state: ScalerState, p: TokenplaneParams, n: int, floor: int, raw_up: int, spec: PoolSpec, now: float
) -> tuple[int, ScaleReason, str]:
    """(target, reason, note) when no need is above the ``n`` serving: ``floor`` is the need at the
    scale-down utilisation, clamped to [min, max]; ``raw_up`` the scale-up need, for the note."""
    lo, hi = spec.min_instances, spec.max_instances
    if n > hi:
        return hi, ScaleReason.AT_MAX, f"serving {n} > max {hi}"
    if n < lo:
        return lo, ScaleReason.AT_MIN, f"serving {n} < min {lo}"
    if floor >= n:
        if raw_up < lo and n == lo:
            return n, ScaleReason.AT_MIN, f"need {raw_up} < min {lo}"
        return n, ScaleReason.STEADY, "need met"
    last_up = state.last_scale_up_s
    cooldown, stab = p.cooldown_s, p.stabilisation_s
    if p.window_from_cold_start:
        # Released capacity takes a cold start (plus a decision) to come back: hold what the
        # last such span asked for, no longer; and decide no shrink before one span is seen.
        cooldown = stab = spec.cold_start_s + p.decision_interval_s
        first = state.first_decision_s
        if first is None or now - first < stab:
            return n, ScaleReason.COOLDOWN, f"first {stab:.0f}s: no evidence to shrink on yet"
    if last_up is not None and now - last_up < cooldown:
        return (
            n,
            ScaleReason.COOLDOWN,
            f"scale-up {now - last_up:.0f}s ago < cooldown {cooldown:.0f}s",
        )
    window = [r for t, r in state.recommendations if now - stab < t <= now]
    stabilised = max([floor, *window])
    if stabilised >= n:
        return n, ScaleReason.COOLDOWN, f"stabilisation window holds {stabilised}"
    step = max(1, math.floor(n * p.scale_down_step_fraction))
    target = max(stabilised, lo, n - step)
    return target, ScaleReason.OVERPROVISIONED, f"need {stabilised} over {stab:.0f}s < {n}"
