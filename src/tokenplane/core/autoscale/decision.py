"""What an autoscaler returns: target pool sizes, the actions that move toward them, and why.

A :class:`ScaleDecision` always carries a :class:`ScaleReason` (stable strings, used as metric
labels) and a short human ``note``; actions are plain values the shell carries out in order.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from tokenplane.core.views import InstanceId


class ScaleReason(StrEnum):
    """Why the serving target is what it is."""

    QUEUE_GROWING = "queue_growing"  # backlog needs more capacity to drain within the target time
    SLO_AT_RISK = "slo_at_risk"  # TTFT/TBT attainment below target while loaded
    FORECAST_RISE = "forecast_rise"  # forecast demand (plus burst margin) exceeds capacity
    KV_PRESSURE = "kv_pressure"  # KV caches nearly full: memory, not compute, limits the pool
    OVERPROVISIONED = "overprovisioned"  # need has stayed below serving past cooldown: drain
    COOLDOWN = "cooldown"  # would scale down, but a cooldown or stabilisation window holds it
    AT_MAX = "at_max"  # need exceeds max_instances
    AT_MIN = "at_min"  # need is below min_instances
    STEADY = "steady"  # serving matches need
    WARM_BACKFILL = "warm_backfill"  # serving steady; only the warm pool is being refilled/trimmed
    UTILISATION_HIGH = "utilisation_high"  # HPA: metric above target beyond tolerance
    UTILISATION_LOW = "utilisation_low"  # HPA: metric below target beyond tolerance
    WITHIN_TOLERANCE = "within_tolerance"  # HPA: metric/target within 1 ± tolerance
    FIXED_SIZE = "fixed_size"  # static fleet


class ActionKind(StrEnum):
    ACTIVATE_WARM = "activate_warm"  # move `count` warm instances into serving (seconds)
    START_COLD = "start_cold"  # start `count` cold instances; they land in the warm pool
    DRAIN = "drain"  # stop routing to `instance_ids`; stop each once its in-flight work is done
    DRAIN_TO_WARM = "drain_to_warm"  # as DRAIN, but park each in the warm pool instead of stopping
    STOP_WARM = "stop_warm"  # stop `count` idle warm instances (nothing in flight there)
    CANCEL_WARMING = "cancel_warming"  # stop `count` instances still warming (newest first): no drain
    NOOP = "noop"


class ScaleAction(msgspec.Struct, frozen=True):
    kind: ActionKind
    count: int = 0
    instance_ids: tuple[InstanceId, ...] = ()


NOOP_ACTION = ScaleAction(ActionKind.NOOP)


class Needs(msgspec.Struct, frozen=True):
    """The serving-instance needs each signal implies (before min/max), for logs, metrics and tests."""

    demand: int = 0  # forecast demand (+ burst margin) over the activation horizon / usable capacity
    queue: int = 0  # drain the backlog within the target time while serving current demand
    slo: int = 0  # SLO-attainment feedback
    kv: int = 0  # bring mean KV use back to the target
    provision: int = 0  # forecast over the cold-start horizon: serving + warm + warming to hold
    scale_down_to: int = 0  # the need at the scale-down utilisation (hysteresis), recorded per decision
    forecast_rps: float = 0.0
    capacity_rps: float = 0.0  # per-instance capacity used (learned or prior)
    provision_rps: float = 0.0  # rate serving + warm must cover within a cold start
    headroom: float = 1.0  # measured rise over the activation horizon (x the level)
    capacity_prior_share: float = 1.0  # the prior's share of capacity_rps (1: nothing learned)


class ScaleDecision(msgspec.Struct, frozen=True):
    target_serving: int
    target_warm: int
    reason: ScaleReason
    actions: tuple[ScaleAction, ...] = (NOOP_ACTION,)
    current_serving: int = 0
    recommendation: int = 0  # the unstabilised serving recommendation (what stabilisation windows record)
    needs: Needs | None = None
    note: str = ""

    @property
    def cold_starts(self) -> int:
        return sum(a.count for a in self.actions if a.kind is ActionKind.START_COLD)

    @property
    def activations(self) -> int:
        return sum(a.count for a in self.actions if a.kind is ActionKind.ACTIVATE_WARM)

    @property
    def drained(self) -> tuple[InstanceId, ...]:
        return tuple(
            i
            for a in self.actions
            if a.kind in (ActionKind.DRAIN, ActionKind.DRAIN_TO_WARM)
            for i in a.instance_ids
        )

    @property
    def warm_stopped(self) -> int:
        return sum(a.count for a in self.actions if a.kind is ActionKind.STOP_WARM)

    @property
    def warming_cancelled(self) -> int:
        return sum(a.count for a in self.actions if a.kind is ActionKind.CANCEL_WARMING)
