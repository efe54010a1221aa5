"""Turn target pool sizes into actions; shared by every autoscaler so they differ only in targets.

Order of preference, cheapest first:

1. Serving short: activate warm instances (seconds); the rest of the gap is covered by instances
   already warming, then by new cold starts (they land warm and the next decision activates them).
2. Serving long: drain the least-loaded serving instances (fewest running + waiting, then id, so
   the choice is deterministic); while the warm pool is below its target, drained instances are
   parked there (``DRAIN_TO_WARM``) instead of stopped, which saves a cold start later.
3. Warm pool: cold-start the shortfall of (target_warm + serving gap) against warm + warming +
   parked; beyond it, cancel instances still warming first (up to ``cancel_warming``, which the
   policy sets: they stop costing at once and hold nothing in flight, and a ready warm instance is
   worth more than one still loading), then stop idle warm ones. With ``cancel_warming`` 0 (the
   default, as for HPA) warming instances are left to land and are stopped then if unwanted.
   Cancellable warming instances do not count against parking drained ones: a drained instance
   parks (ready in seconds) and the warming one it replaces is cancelled.

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
    cancel_warming: int = 0,
) -> tuple[ScaleAction, ...]:
    serving = len(signal.serving)
    warm = len(signal.warm)
    warming = len(signal.warming)
    actions: list[ScaleAction] = []

    cancellable = min(warming, max(0, cancel_warming))
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
        kept = warming - cancellable  # warming instances that will land: the warm pool's supply
        parked = min(len(ids), max(0, target_warm - warm - kept)) if park_drained else 0
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
        cancel = min(supply - needed, cancellable)
        if cancel:
            actions.append(ScaleAction(ActionKind.CANCEL_WARMING, cancel))
        stop = min(supply - needed - cancel, warm)
        if stop:
            actions.append(ScaleAction(ActionKind.STOP_WARM, stop))
    return tuple(actions) or (NOOP_ACTION,)
