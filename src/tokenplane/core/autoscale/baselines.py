"""Baselines to compare against: a Kubernetes-HPA-style utilisation scaler and a static fleet.

``HpaScaler`` follows the HorizontalPodAutoscaler's algorithm (autoscaling/v2, default behaviour):

* metric ``m`` = mean utilisation of the ready serving instances (the signal's ``utilisation``,
  or mean KV use with ``metric: kv_usage``); ``ratio = m / target``;
* if ``|ratio − 1| ≤ tolerance`` (0.1) the recommendation is the current replica count;
  otherwise ``desired = ⌈ready × ratio⌉``;
* replicas are every instance of the Deployment (serving + warm + warming: a starting pod counts);
* if pods still starting make the ready-pod recommendation point the other way from the ratio, the
  HPA does not scale (its re-derivation with unready pods at 0 % reverses the direction);
* scale-up is limited per decision to ``max(2 × replicas, replicas + 4)`` (the default policy of
  100 % or 4 pods per period, whichever is more), with no stabilisation;
* scale-down goes to the *largest* recommendation of the last ``stabilisation_s`` (300 s);
* no warm pool: new replicas are cold starts (they land warm and are activated at once, which is
  what a starting pod turning ready amounts to); scale-down drains, as a pod's graceful termination
  does.

Its known weakness for LLM serving, which the comparison is meant to show: a GPU's busy fraction
saturates near 100 % long before queues stop growing, so the ratio caps at 1/target per step while
a backlog builds, and each step waits a full cold start before its pods report ready.

``StaticFleet(n)`` keeps ``n`` instances serving (clamped to [min, max]); it starts what is missing
and never scales on load: the "sized for the peak" reference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec

from tokenplane.core.autoscale.base import AUTOSCALERS
from tokenplane.core.autoscale.decision import ScaleDecision, ScaleReason
from tokenplane.core.autoscale.plan import plan_actions
from tokenplane.core.autoscale.signals import PoolSignal, PoolSpec
from tokenplane.core.params import ParamReader
from tokenplane.core.registry import BuildContext, register

DEFAULT_HPA_TARGET = 0.7
DEFAULT_HPA_TOLERANCE = 0.1
DEFAULT_HPA_STABILISATION_S = 300.0
_EPS = 1e-9


class HpaState(msgspec.Struct, frozen=True):
    recommendations: tuple[tuple[float, int], ...] = ()


class HpaScaler:
    name = "hpa"

    def __init__(
        self,
        *,
        target_utilisation: float = DEFAULT_HPA_TARGET,
        tolerance: float = DEFAULT_HPA_TOLERANCE,
        stabilisation_s: float = DEFAULT_HPA_STABILISATION_S,
        metric: str = "utilisation",
    ) -> None:
        if not target_utilisation > 0:
            raise ValueError(f"target_utilisation must be > 0, got {target_utilisation}")
        if tolerance < 0 or stabilisation_s < 0:
            raise ValueError("tolerance and stabilisation_s must be >= 0")
        if metric not in ("utilisation", "kv_usage"):
            raise ValueError(f"metric must be 'utilisation' or 'kv_usage', got {metric!r}")
        self.target_utilisation = target_utilisation
        self.tolerance = tolerance
        self.stabilisation_s = stabilisation_s
        self.metric = metric
        self._state = HpaState()

    @property
    def state(self) -> HpaState:
        return self._state

    def observe(self, signal: PoolSignal, spec: PoolSpec) -> None:
        pass

    def commit(self, decision: ScaleDecision, *, now: float) -> None:
        recs = tuple(r for r in self._state.recommendations if now - self.stabilisation_s < r[0] <= now)
        self._state = HpaState((*recs, (now, decision.recommendation)))

    def _metric(self, signal: PoolSignal) -> float | None:
        if self.metric == "kv_usage":
            ready = [v for v in signal.serving if v.ready]
            return sum(v.kv_usage for v in ready) / len(ready) if ready else None
        return signal.utilisation

    def decide(self, signal: PoolSignal, spec: PoolSpec, *, now: float) -> ScaleDecision:
        lo, hi = spec.min_instances, spec.max_instances
        ready = sum(1 for v in signal.serving if v.ready)
        replicas = len(signal.serving) + len(signal.warm) + len(signal.warming)
        metric = self._metric(signal)
        if metric is None or ready == 0:
            desired, reason = replicas, ScaleReason.WITHIN_TOLERANCE
            note = "no metric from ready instances"
        else:
            ratio = metric / self.target_utilisation
            if abs(ratio - 1.0) <= self.tolerance + _EPS:
                desired, reason = replicas, ScaleReason.WITHIN_TOLERANCE
            else:
                desired = math.ceil(ready * ratio - _EPS)
                reason = ScaleReason.UTILISATION_HIGH if ratio > 1 else ScaleReason.UTILISATION_LOW
                if (ratio > 1) != (desired > replicas) and desired != replicas:
                    # Starting pods count as replicas but not in the ratio: if they flip the
                    # direction, the HPA skips scaling (it re-derives with them at 0 % and the
                    # ratio reverses), so it neither removes them nor over-adds.
                    desired, reason = replicas, ScaleReason.WITHIN_TOLERANCE
            target = self.target_utilisation
            note = f"metric {metric:.3f} / target {target:.3f} = {ratio:.3f} on {ready} ready"
        desired = min(max(desired, lo), hi)
        recommendation = desired
        if desired > replicas:
            desired = min(desired, max(2 * replicas, replicas + 4))
        elif desired < replicas:
            window = [r for t, r in self._state.recommendations if now - self.stabilisation_s < t <= now]
            stabilised = max([desired, *window])
            if stabilised > desired:
                note += f"; stabilised at {stabilised}"
                reason = ScaleReason.COOLDOWN if stabilised >= replicas else reason
            desired = min(stabilised, replicas)
        if desired == hi and recommendation >= hi and reason is ScaleReason.UTILISATION_HIGH:
            reason = ScaleReason.AT_MAX
        elif desired == lo and reason is ScaleReason.UTILISATION_LOW and desired >= replicas:
            reason = ScaleReason.AT_MIN
        # Replicas include warm (landed) and warming pods. Landed pods serve at once; pods still
        # starting are left to land (and are stopped then if no longer wanted).
        target_serving = max(lo, min(hi, desired))
        serving_now = len(signal.serving)
        if target_serving >= replicas:
            plan_target = target_serving
        else:
            plan_target = min(target_serving, serving_now + len(signal.warm))
        actions = plan_actions(signal, spec, target_serving=plan_target, target_warm=0, park_drained=False)
        return ScaleDecision(
            target_serving=target_serving,
            target_warm=0,
            reason=reason,
            actions=actions,
            current_serving=serving_now,
            recommendation=recommendation,
            note=note,
        )


class StaticFleet:
    name = "static"

    def __init__(self, instances: int) -> None:
        if instances < 0:
            raise ValueError(f"instances must be >= 0, got {instances}")
        self.instances = instances

    @property
    def state(self) -> None:
        return None

    def observe(self, signal: PoolSignal, spec: PoolSpec) -> None:
        pass

    def commit(self, decision: ScaleDecision, *, now: float) -> None:
        pass

    def decide(self, signal: PoolSignal, spec: PoolSpec, *, now: float) -> ScaleDecision:
        target = min(max(self.instances, spec.min_instances), spec.max_instances)
        actions = plan_actions(signal, spec, target_serving=target, target_warm=0, park_drained=False)
        return ScaleDecision(
            target_serving=target,
            target_warm=0,
            reason=ScaleReason.FIXED_SIZE,
            actions=actions,
            current_serving=len(signal.serving),
            recommendation=target,
            note=f"static fleet of {target}",
        )


@register(AUTOSCALERS, "hpa")
def _build_hpa(params: Mapping[str, Any], ctx: BuildContext) -> HpaScaler:
    reader = ParamReader(
        "autoscaler 'hpa'", params, ("target_utilisation", "tolerance", "stabilisation_s", "metric")
    )
    return HpaScaler(
        target_utilisation=reader.float_(
            "target_utilisation", DEFAULT_HPA_TARGET, min_value=0.0, exclusive_min=True
        ),
        tolerance=reader.float_("tolerance", DEFAULT_HPA_TOLERANCE, min_value=0.0),
        stabilisation_s=reader.float_("stabilisation_s", DEFAULT_HPA_STABILISATION_S, min_value=0.0),
        metric=reader.choice("metric", "utilisation", ("utilisation", "kv_usage")),
    )


@register(AUTOSCALERS, "static")
def _build_static(params: Mapping[str, Any], ctx: BuildContext) -> StaticFleet:
    reader = ParamReader("autoscaler 'static'", params, ("instances",))
    if not reader.has("instances"):
        raise ValueError("param 'instances' is required")
    return StaticFleet(reader.int_("instances", 0, min_value=0))
