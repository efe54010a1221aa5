"""The twin's driver of the core's retry plan: :func:`tokenplane.core.retry_budget.attempts` in virtual time.

The gateway drives the plan from a coroutine (``gateway/app.py``); the twin drives the same generator
from its event loop. For each logical request the twin holds one :class:`PlanDriver`: the plan yields
an :class:`Attempt` (its kind, the instances to avoid, the delay before it), the twin runs it on an
engine, and when the attempt ends (finished, timed out by the client, lost with its instance) the
twin reports an :class:`AttemptOutcome` through :meth:`PlanDriver.report`. The driver then either
dispatches the next attempt (at once, or after ``delay_s`` on the event loop) or hands the plan's
:class:`PlanResult` to the fleet. Attempts, backoff with jitter, the budget and its cost are the
core's; nothing in ``sim/`` decides them.

The twin's settings map onto the core's policy (:class:`RetryPlanner`):

* ``clients.retry``: ``none`` is ``max_attempts = 1``; ``naive`` retries at once (no backoff);
  ``backoff`` uses ``backoff_base_s``/``backoff_max_s`` with multiplier 2 and full jitter from the
  run's client RNG;
* ``clients.max_attempts`` caps attempts before a retry; a continuation (``controls.continuation``,
  a stream resumed after its instance was lost) is not capped by the client, as the client never
  saw a failure: ``max_continuation_attempts`` is unbounded;
* ``controls.retry_budget``: the core's :class:`RetryBudget` (no budget when absent);
* a client timeout, and a broken stream without continuation, are ``CLIENT_RESTART`` outcomes: the
  client re-sends from scratch, so the next attempt is a RETRY.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Generic, TypeVar

from tokenplane.core.outcomes import AttemptOutcome
from tokenplane.core.retry_budget import (
    Attempt,
    PlanResult,
    RetryBudget,
    RetryPlan,
    RetryPolicy,
    attempts,
)
from tokenplane.core.views import RequestInfo
from tokenplane.sim.faults import ClientSpec, ControlSpec
from tokenplane.sim.kernel import EventLoop

#: Continuations are not capped by the client's ``max_attempts`` (see the module docstring).
UNBOUNDED_CONTINUATIONS = 1 << 30

T = TypeVar("T")


def twin_retry_policy(clients: ClientSpec) -> RetryPolicy:
    """The core's retry policy that the twin's client settings describe."""
    retries = clients.retry != "none"
    backoff = clients.retry == "backoff"
    return RetryPolicy(
        max_attempts=clients.max_attempts if retries else 1,
        backoff_base_s=clients.backoff_base_s if backoff else 0.0,
        backoff_multiplier=2.0,
        backoff_max_s=clients.backoff_max_s,
        max_continuation_attempts=UNBOUNDED_CONTINUATIONS,
    )


class RetryPlanner:
    """Starts one core plan per logical request with the run's policy, budget and client RNG."""

    def __init__(
        self,
        policy: RetryPolicy,
        budget: RetryBudget | None,
        *,
        allow_continuation: bool,
        rng: random.Random | None,
    ) -> None:
        self.policy = policy
        self.budget = budget
        self.allow_continuation = allow_continuation
        self.rng = rng

    @classmethod
    def from_specs(cls, clients: ClientSpec, controls: ControlSpec, *, seed: int) -> RetryPlanner:
        budget = RetryBudget.from_params(controls.retry_budget) if controls.retry_budget is not None else None
        # The RNG only jitters backoff; naive clients retry at once and draw nothing.
        rng = random.Random(f"tokenplane-clients:{seed}") if clients.retry == "backoff" else None
        return cls(twin_retry_policy(clients), budget, allow_continuation=controls.continuation, rng=rng)

    def plan(self, info: RequestInfo, *, now: float) -> RetryPlan:
        return attempts(
            info,
            budget=self.budget,
            now=now,
            policy=self.policy,
            allow_continuation=self.allow_continuation,
            rng=self.rng,
        )


class PlanDriver(Generic[T]):
    """One logical request's plan, driven in virtual time.

    ``dispatch(now, item)`` runs :attr:`attempt` for ``item`` (the fleet's pending request);
    ``finish(now, item, result)`` ends it when the plan returns.
    """

    __slots__ = ("_dispatch", "_finish", "_loop", "_plan", "attempt", "item")

    def __init__(
        self,
        plan: RetryPlan,
        item: T,
        *,
        loop: EventLoop,
        dispatch: Callable[[float, T], None],
        finish: Callable[[float, T, PlanResult], None],
    ) -> None:
        self._plan = plan
        self._loop = loop
        self._dispatch = dispatch
        self._finish = finish
        self.item = item
        self.attempt: Attempt = next(plan)

    def start(self, now: float) -> None:
        self._dispatch(now, self.item)

    def report(self, outcome: AttemptOutcome) -> Attempt | None:
        """Send one attempt's outcome; run the next attempt, or finish. The next attempt, if any."""
        now = outcome.at_s
        try:
            self.attempt = self._plan.send(outcome)
        except StopIteration as stop:
            result: PlanResult = stop.value
            self._finish(now, self.item, result)
            return None
        delay = self.attempt.delay_s
        if delay > 0:
            self._loop.schedule(now + delay, self._dispatch, self.item)
        else:
            self._dispatch(now, self.item)
        return self.attempt

    def close(self) -> None:
        """The request ended outside the plan (no instance, too long, done): drop the generator."""
        self._plan.close()
