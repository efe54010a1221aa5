"""The state backend's own Prometheus metrics: whether Redis answers, what fell back to local
state, and what came from other replicas."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class StateMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.up = Gauge(
            "tokenplane_state_backend_up",
            "1 while the shared state backend (Redis) answers; 0 while this replica runs on local state",
            registry=registry,
        )
        self.up.set(1)
        self.fail_open = Counter(
            "tokenplane_state_fail_open",
            "Operations that fell back to local state because the shared backend was unavailable",
            ["operation"],
            registry=registry,
        )
        self.peer_events = Counter(
            "tokenplane_state_peer_events",
            "Breaker transitions and routing observations received from other replicas",
            ["kind"],
            registry=registry,
        )
