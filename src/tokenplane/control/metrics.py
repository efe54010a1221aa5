"""Prometheus metrics of the control loop, in a registry the caller gives (the gateway's own).

* ``tokenplane_autoscaler_decisions_total{pool, reason}``: decisions, by :class:`ScaleReason`;
* ``tokenplane_autoscaler_actions_total{pool, action}``: instances acted on, by action kind;
* ``tokenplane_autoscaler_errors_total{pool, op}``: actuator or registry calls that failed;
* ``tokenplane_autoscaler_target_serving_instances{pool}`` / ``..._target_warm_instances{pool}``;
* ``tokenplane_autoscaler_instances{pool, state}``: serving, warm, warming, draining as the loop
  last saw them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

STATES = ("serving", "warm", "warming", "draining")


class LoopMetrics:
    def __init__(self, registry: CollectorRegistry, pool: str) -> None:
        self.pool = pool
        self.decisions = Counter(
            "tokenplane_autoscaler_decisions",
            "Autoscaler decisions by reason",
            ["pool", "reason"],
            registry=registry,
        )
        self.actions = Counter(
            "tokenplane_autoscaler_actions",
            "Instances the autoscaler acted on, by action",
            ["pool", "action"],
            registry=registry,
        )
        self.errors = Counter(
            "tokenplane_autoscaler_errors",
            "Actuator or pool-registry calls that failed, by operation",
            ["pool", "op"],
            registry=registry,
        )
        self.target_serving = Gauge(
            "tokenplane_autoscaler_target_serving_instances",
            "Serving instances the autoscaler last aimed for",
            ["pool"],
            registry=registry,
        )
        self.target_warm = Gauge(
            "tokenplane_autoscaler_target_warm_instances",
            "Warm instances the autoscaler last aimed for",
            ["pool"],
            registry=registry,
        )
        self.instances = Gauge(
            "tokenplane_autoscaler_instances",
            "Instances by lifecycle state, as the control loop last saw them",
            ["pool", "state"],
            registry=registry,
        )

    def decision(self, reason: str, target_serving: int, target_warm: int) -> None:
        self.decisions.labels(self.pool, reason).inc()
        self.target_serving.labels(self.pool).set(target_serving)
        self.target_warm.labels(self.pool).set(target_warm)

    def acted(self, action: str, count: int) -> None:
        if count:
            self.actions.labels(self.pool, action).inc(count)

    def error(self, op: str) -> None:
        self.errors.labels(self.pool, op).inc()

    def fleet(self, counts: dict[str, int]) -> None:
        for state in STATES:
            self.instances.labels(self.pool, state).set(counts.get(state, 0))
