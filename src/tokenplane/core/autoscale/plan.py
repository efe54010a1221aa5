"""Turn target pool sizes into actions; shared by every autoscaler so they differ only in targets.

Order of preference, cheapest first:

1. Serving short: activate warm instances (seconds); the rest of the gap is covered by instances
   already warming, then by new cold starts (they land warm and the next decision activates them).
2. Serving long: drain the least-loaded serving instances (fewest running + waiting, then id, so
   the choice is deterministic); while the warm pool is below its target, drained instances are
   parked there (``DRAIN_TO_WARM``) instead of stopped, which saves a cold start later.
3. Warm pool: cold-start the shortfall of (target_warm + serving gap) against warm + warming +
   parked; stop idle warm instances beyond it (never warming ones: they are stopped once warm).

Cold starts never take the total (serving + warm + warming + draining) past ``max_instances``,
nor number more than ``max_cold_starts`` when the caller gives one.
In-flight work is never cut: scale-down only drains.
"""

from __future__ import annotations

from tokenplane.core.autoscale.decision import NOOP_ACTION, ActionKind, ScaleAction
from tokenplane.core.autoscale.signals import PoolSignal, PoolSpec


def plan_actions(
    signal: PoolSignal,
    spec: PoolSpec,
    *,
    target_serving: int,
    target_warm: int,
    park_drained: bool = True,
    max_cold_starts: int | None = None,
) -> tuple[ScaleAction, ...]:
    serving = len(signal.serving)
    warm = len(signal.warm)
    warming = len(signal.warming)
    actions: list[ScaleAction] = []

    short = 0
    parked = 0
    if target_serving > serving:
        activate = min(target_serving - serving, warm)
        if activate:
            actions.append(ScaleAction(ActionKind.ACTIVATE_WARM, activate))
        warm -= activate
        short = target_serving - serving - activate
    elif target_serving < serving:
        victims = sorted(signal.serving, key=lambda v: (v.running + v.waiting, v.instance_id))
        ids = tuple(v.instance_id for v in victims[: serving - target_serving])
        parked = min(len(ids), max(0, target_warm - warm - warming)) if park_drained else 0
        if parked:
            actions.append(ScaleAction(ActionKind.DRAIN_TO_WARM, parked, ids[:parked]))
        if len(ids) > parked:
            actions.append(ScaleAction(ActionKind.DRAIN, len(ids) - parked, ids[parked:]))

    supply = warm + warming + parked
    needed = target_warm + short
    if supply < needed:
        headroom = max(0, spec.max_instances - signal.total_instances)
        cold = min(needed - supply, headroom)
        if max_cold_starts is not None:
            cold = min(cold, max(0, max_cold_starts))
        if cold:
            actions.append(ScaleAction(ActionKind.START_COLD, cold))
    elif supply > needed:
        stop = min(supply - needed, warm)
        if stop:
            actions.append(ScaleAction(ActionKind.STOP_WARM, stop))
    return tuple(actions) or (NOOP_ACTION,)
