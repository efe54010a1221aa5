"""The gateway's resilience state: per-instance circuit breakers, the retry budget, and their metrics.

Decisions are the core's: :class:`~tokenplane.core.breaker.BreakerBoard` (fed every attempt's
outcome, with the attempt's time to first token as its latency), :func:`filter_allowed` before the
router sees the candidates, :class:`~tokenplane.core.retry_budget.RetryBudget` and the
:func:`~tokenplane.core.retry_budget.attempts` plan that yields attempts and receives outcomes. This
module only holds them, turns their events into Prometheus series, and builds the plan for one
request. :meth:`Resilience.tick` (from the gateway's housekeeping loop) materialises breaker
cooldowns so ``/metrics`` and ``/v1/instances`` show HALF_OPEN without traffic.

Metrics (registered in the gateway's registry): ``tokenplane_breaker_state{instance}`` (0 closed,
1 half-open, 2 open), ``tokenplane_breaker_transitions_total{instance, from_state, to_state, reason}``,
``tokenplane_retries_total{model}``, ``tokenplane_continuations_total{model}``,
``tokenplane_retry_budget_balance`` (retries still allowed in the window).

Cost when nothing fails: one ``filter_allowed`` pass (no allocation when every breaker allows), two
counter adds for the budget's first attempt, one ``on_attempt`` and one ``on_result`` per request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenplane.core.breaker import (
    PEER_REASONS,
    BreakerBoard,
    BreakerEvent,
    BreakerReason,
    BreakerState,
    filter_allowed,
)
from tokenplane.core.outcomes import AttemptOutcome
from tokenplane.core.retry_budget import RetryBudget, RetryPlan, RetryPolicy, attempts
from tokenplane.core.state_store import CounterStore
from tokenplane.core.views import InstanceId, InstanceView, RequestInfo
from tokenplane.gateway.resilience_config import BreakerParams, RetryConfig

log = logging.getLogger(__name__)

STATE_VALUE = {BreakerState.CLOSED: 0.0, BreakerState.HALF_OPEN: 1.0, BreakerState.OPEN: 2.0}


class _Collector(Collector):
    def __init__(self, res: Resilience, instances: Callable[[], Iterable[str]]) -> None:
        self._res = res
        self._instances = instances

    def collect(self) -> Iterator[Metric]:
        now = time.monotonic()
        state = GaugeMetricFamily(
            "tokenplane_breaker_state",
            "Circuit breaker per instance: 0 closed, 1 half-open, 2 open",
            labels=["instance"],
        )
        for iid in self._instances():
            state.add_metric([iid], STATE_VALUE[self._res.board.state(iid, now=now)])
        yield state
        requests, tokens = self._res.budget.balance(now=now)
        bal = GaugeMetricFamily(
            "tokenplane_retry_budget_balance", "Retries (requests) still allowed in the budget window"
        )
        bal.add_metric([], requests)
        yield bal
        tok = GaugeMetricFamily(
            "tokenplane_retry_budget_token_balance", "Retry tokens still allowed in the budget window"
        )
        tok.add_metric([], tokens)
        yield tok


class BreakerPeers(Protocol):
    """Where this replica's breaker transitions go so the other replicas adopt them
    (:class:`~tokenplane.shared_state.peer_channel.PeerChannel`)."""

    def publish_breaker(self, instance_id: str, state: str, cooldown_s: float) -> None: ...


class Resilience:
    """Breakers and the retry budget for one gateway (instance ids are unique across models)."""

    def __init__(
        self,
        retry: RetryConfig,
        breaker: BreakerParams,
        registry: CollectorRegistry,
        instances: Callable[[], Iterable[str]],
        budget_store: CounterStore | None = None,
    ) -> None:
        self.retry = retry
        self.board = BreakerBoard(breaker.build())
        # several replicas: a store they share, so the budget is the fleet's (the formula for one)
        self.budget = RetryBudget.from_params(retry.budget_params(), store=budget_store)
        self.policy = RetryPolicy.from_params(retry.policy_params())
        self.peers: BreakerPeers | None = None
        self._transitions = Counter(
            "tokenplane_breaker_transitions",
            "Circuit breaker transitions by instance and reason",
            ["instance", "from_state", "to_state", "reason"],
            registry=registry,
        )
        self._retries = Counter(
            "tokenplane_retries", "Retries (a new attempt before any token was delivered)", ["model"],
            registry=registry,
        )  # fmt: skip
        self._continuations = Counter(
            "tokenplane_continuations", "Stream continuations on another instance", ["model"],
            registry=registry,
        )  # fmt: skip
        registry.register(_Collector(self, instances))

    # -- the request path ---------------------------------------------------------------------
    def plan(
        self, info: RequestInfo, *, now: float, deadline_s: float | None, allow_continuation: bool
    ) -> RetryPlan:
        return attempts(
            info,
            budget=self.budget,
            now=now,
            policy=self.policy,
            deadline_s=deadline_s,
            allow_continuation=allow_continuation,
        )

    def candidates(
        self, views: Sequence[InstanceView], exclude: frozenset[InstanceId], now: float
    ) -> Sequence[InstanceView]:
        allowed = filter_allowed(views, self.board, now=now)
        if exclude:
            allowed = [v for v in allowed if v.instance_id not in exclude]
        return allowed

    def on_attempt(self, instance_id: InstanceId, now: float) -> None:
        events = self.board.on_attempt(instance_id, now=now)
        if events:
            self._record(events)

    def on_outcome(self, outcome: AttemptOutcome) -> None:
        assert outcome.instance_id is not None
        events = self.board.on_result(outcome.instance_id, outcome.ok, outcome.latency_s, now=outcome.at_s)
        if events:
            self._record(events)

    def on_abandoned(self, instance_id: InstanceId) -> None:
        """The client left before the instance answered: no verdict on the instance."""
        self.board.release(instance_id)

    def count_attempt(self, model: str, continuation: bool) -> None:
        (self._continuations if continuation else self._retries).labels(model).inc()

    def tick(self, now: float) -> None:
        events = self.board.tick(now)
        if events:
            self._record(events)

    def state(self, instance_id: InstanceId, now: float) -> BreakerState:
        return self.board.state(instance_id, now=now)

    def adopt(self, instance_id: InstanceId, state: str, cooldown_s: float, now: float) -> None:
        """Another replica opened (``"open"``) or closed (``"closed"``) this instance's breaker."""
        to = BreakerState.OPEN if state == "open" else BreakerState.CLOSED
        events = self.board.adopt(instance_id, to, cooldown_s=cooldown_s, now=now)
        if events:
            self._record(events)

    def _record(self, events: Sequence[BreakerEvent]) -> None:
        peers = self.peers
        for e in events:
            labels = (e.instance_id, e.from_state.value, e.to_state.value, e.reason.value)
            self._transitions.labels(*labels).inc()
            log.info("breaker %s: %s -> %s (%s)", *labels)
            if peers is None or e.reason in PEER_REASONS:
                continue
            if e.to_state is BreakerState.OPEN:
                peers.publish_breaker(e.instance_id, "open", self.board.cooldown_s(e.instance_id))
            elif e.reason is BreakerReason.PROBE_SUCCEEDED:
                peers.publish_breaker(e.instance_id, "closed", 0.0)
