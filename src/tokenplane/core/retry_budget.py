"""Retry budgets (Finagle / Envoy style) and a retry plan written once as a generator.

Budget. Over a sliding window of ``window_s`` (the :class:`CounterStore`'s), a retry is allowed only
while, counting it,

    retries    <= ratio       × first attempts + min_per_s        × window_s     (requests)
    retry_toks <= token_ratio × first tokens   + min_tokens_per_s × window_s     (tokens)

A retry's token cost is what the upstream must process again: ``prompt + delivered + remaining
output`` (a retry of a 50k-token prompt costs 50k, not 1). Both counters sit in the shared store, so
gateway replicas draw from one budget. :meth:`RetryBudget.try_spend` checks and records in one call;
a spend never takes either balance below zero at the moment it is made. As first attempts age out of
the window faster than the retries made after them, a balance can later read negative (debt); that
only blocks retries until the window has moved on.

Plan. :func:`attempts` is a generator in the style of httpx's ``auth_flow``: it yields
:class:`Attempt`s and receives :class:`~tokenplane.core.outcomes.AttemptOutcome`s via ``send``; its
return value (``StopIteration.value``) is the :class:`PlanResult`. Written once, the twin drives it
synchronously from its event loop and the gateway from a coroutine; :func:`drive` is the trivial
synchronous driver. Rules, in order, after a failed attempt:

1. tokens already delivered to the client make the next attempt a CONTINUATION (a fresh retry would
   repeat text); if continuation is off for the tenant, the request FAILS (``CONTINUATION_DISABLED``).
   A ``CLIENT_RESTART`` outcome (the twin's client gave up and re-sends from scratch) discards what
   was delivered, so the next attempt is a RETRY;
2. at most ``max_attempts`` attempts in all (first, retries and continuations together), or
   ``max_continuation_attempts`` when the next one is a continuation and that is set (a shell may let
   a stream the user is reading be resumed more often than a request is retried);
3. no attempt once ``now >= deadline``, nor when ``now + delay + predicted_attempt_s`` passes it;
4. the budget must allow it (requests, then tokens);
5. the next attempt excludes every instance tried so far (``Attempt.exclude``, for the router), after
   ``delay_s``: exponential backoff ``backoff_base_s × backoff_multiplier ** (retry - 1)`` capped at
   ``backoff_max_s``, with full jitter when an RNG is passed.

Costs charged to the budget (:func:`first_attempt_cost`, :func:`retry_cost`), the same in both shells:
a first attempt ``prompt + max_output``; a retry or continuation ``prompt + delivered + remaining``
(``remaining = max(0, max_output - delivered)``). ``budget=None`` plans without a budget (a twin run
with no control plane); everything else is unchanged.

Params (:meth:`RetryBudget.from_params`, :meth:`RetryPolicy.from_params`)::

    budget: {ratio: 0.2, min_per_s: 1.0, token_ratio: 0.2, min_tokens_per_s: 2000, window_s: 10}
    policy: {max_attempts: 3, backoff_base_s: 0.05, backoff_multiplier: 2, backoff_max_s: 1.0}

Cost: four windowed counter reads and up to two adds per retry decision; O(1) per first attempt.
Failure modes: check-then-add across replicas with a lagging shared store can overspend by what other
replicas spend in one sync period; the floor lets a quiet system retry a little even with no traffic;
``predicted_attempt_s`` is the caller's estimate, so a bad one refuses or wastes a last attempt.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator, Mapping
from enum import StrEnum
from typing import Any

import msgspec

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.outcomes import AttemptOutcome, AttemptResult, TerminalOutcome
from tokenplane.core.params import ParamReader
from tokenplane.core.state_store import CounterStore, SlidingWindowCounterStore
from tokenplane.core.views import InstanceId, RequestInfo

DEFAULT_RATIO = 0.2
DEFAULT_MIN_PER_S = 1.0
DEFAULT_MIN_TOKENS_PER_S = 2000.0
DEFAULT_WINDOW_S = 10.0


class AttemptKind(StrEnum):
    FIRST = "first"
    RETRY = "retry"
    CONTINUATION = "continuation"


class RetryReason(StrEnum):
    ALLOWED = "allowed"
    SUCCEEDED = "succeeded"
    BUDGET_REQUESTS = "budget_requests"
    BUDGET_TOKENS = "budget_tokens"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    DEADLINE_PASSED = "deadline_passed"
    DEADLINE_UNREACHABLE = "deadline_unreachable"
    CONTINUATION_DISABLED = "continuation_disabled"


class BudgetDecision(msgspec.Struct, frozen=True):
    allowed: bool
    reason: RetryReason


class RetryBudget:
    def __init__(
        self,
        store: CounterStore,
        *,
        ratio: float = DEFAULT_RATIO,
        min_per_s: float = DEFAULT_MIN_PER_S,
        token_ratio: float | None = None,
        min_tokens_per_s: float = DEFAULT_MIN_TOKENS_PER_S,
        pool: str = "default",
    ) -> None:
        token_ratio = ratio if token_ratio is None else token_ratio
        if not (ratio >= 0 and min_per_s >= 0 and token_ratio >= 0 and min_tokens_per_s >= 0):
            raise InvalidPolicyConfig("retry budget: ratios and floors must be >= 0")
        self._store = store
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.token_ratio = token_ratio
        self.min_tokens_per_s = min_tokens_per_s
        p = f"retry:{pool}:"
        self._keys = (p + "first", p + "first_tokens", p + "retry", p + "retry_tokens")

    @classmethod
    def from_params(cls, params: Mapping[str, Any], *, store: CounterStore | None = None) -> RetryBudget:
        keys = ("ratio", "min_per_s", "token_ratio", "min_tokens_per_s", "window_s")
        r = ParamReader("retry budget", params, keys)
        ratio = r.float_("ratio", DEFAULT_RATIO, min_value=0.0)
        window_s = r.float_("window_s", DEFAULT_WINDOW_S, min_value=0.0, exclusive_min=True)
        return cls(
            store or SlidingWindowCounterStore(window_s),
            ratio=ratio,
            min_per_s=r.float_("min_per_s", DEFAULT_MIN_PER_S, min_value=0.0),
            token_ratio=r.float_("token_ratio", ratio, min_value=0.0),
            min_tokens_per_s=r.float_("min_tokens_per_s", DEFAULT_MIN_TOKENS_PER_S, min_value=0.0),
        )

    def balance(self, *, now: float) -> tuple[float, float]:
        """(retries, retry tokens) still allowed in the window; negative means debt (see docstring)."""
        first, first_tok, retry, retry_tok = (self._store.get(k, now=now) for k in self._keys)
        window = self._store.window_s
        return (
            self.ratio * first + self.min_per_s * window - retry,
            self.token_ratio * first_tok + self.min_tokens_per_s * window - retry_tok,
        )

    def on_first_attempt(self, cost_tokens: int, *, now: float) -> None:
        self._store.add(self._keys[0], 1, now=now)
        self._store.add(self._keys[1], cost_tokens, now=now)

    def check(self, cost_tokens: int, *, now: float) -> BudgetDecision:
        requests, tokens = self.balance(now=now)
        if requests < 1:
            return BudgetDecision(False, RetryReason.BUDGET_REQUESTS)
        if tokens < cost_tokens:
            return BudgetDecision(False, RetryReason.BUDGET_TOKENS)
        return BudgetDecision(True, RetryReason.ALLOWED)

    def try_spend(self, cost_tokens: int, *, now: float) -> BudgetDecision:
        decision = self.check(cost_tokens, now=now)
        if decision.allowed:
            self._store.add(self._keys[2], 1, now=now)
            self._store.add(self._keys[3], cost_tokens, now=now)
        return decision


class RetryPolicy(msgspec.Struct, frozen=True):
    max_attempts: int = 3
    backoff_base_s: float = 0.05
    backoff_multiplier: float = 2.0
    backoff_max_s: float = 1.0
    max_continuation_attempts: int | None = None  # None: continuations count against max_attempts

    def cap(self, kind: AttemptKind) -> int:
        """The most attempts in all when the next one is of ``kind``."""
        if kind is AttemptKind.CONTINUATION and self.max_continuation_attempts is not None:
            return self.max_continuation_attempts
        return self.max_attempts

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> RetryPolicy:
        d = cls()
        r = ParamReader("retry policy", params, tuple(cls.__struct_fields__))
        return cls(
            max_attempts=r.int_("max_attempts", d.max_attempts, min_value=1),
            backoff_base_s=r.float_("backoff_base_s", d.backoff_base_s, min_value=0.0),
            backoff_multiplier=r.float_("backoff_multiplier", d.backoff_multiplier, min_value=1.0),
            backoff_max_s=r.float_("backoff_max_s", d.backoff_max_s, min_value=0.0),
            max_continuation_attempts=(
                r.int_("max_continuation_attempts", 1, min_value=1)
                if r.has("max_continuation_attempts")
                else None
            ),
        )

    def delay_s(self, retry: int, rng: random.Random | None) -> float:
        """Delay before the ``retry``-th extra attempt (1-based); full jitter when ``rng`` is given."""
        base = min(self.backoff_max_s, self.backoff_base_s * self.backoff_multiplier ** (retry - 1))
        return base if rng is None else rng.uniform(0.0, base)


class ContinuationSwitch(msgspec.Struct, frozen=True):
    """Whether a tenant's streams may be continued on another instance after a mid-stream failure."""

    default: bool = True
    tenants: Mapping[str, bool] = msgspec.field(default_factory=dict)

    def allowed(self, tenant: str) -> bool:
        return self.tenants.get(tenant, self.default)


class Attempt(msgspec.Struct, frozen=True):
    """One attempt to run: route it avoiding ``exclude``, after ``delay_s``.

    For a CONTINUATION, ``resume_tokens`` output tokens were already delivered: the shell re-issues
    the prompt plus that text and splices the new stream on.
    """

    number: int
    kind: AttemptKind
    exclude: frozenset[InstanceId]
    delay_s: float
    resume_tokens: int
    cost_tokens: int

    @property
    def is_continuation(self) -> bool:
        return self.kind is AttemptKind.CONTINUATION


class PlanResult(msgspec.Struct, frozen=True):
    terminal: TerminalOutcome
    reason: RetryReason
    attempts: int
    tokens_delivered: int
    instances: tuple[InstanceId, ...] = ()


RetryPlan = Generator[Attempt, AttemptOutcome, PlanResult]


def first_attempt_cost(request: RequestInfo) -> int:
    """Tokens a first attempt counts in the budget: the prompt and the output it may produce."""
    return request.prompt_tokens + request.max_output_tokens


def retry_cost(request: RequestInfo, delivered: int) -> int:
    """Tokens a retry (``delivered == 0``) or continuation costs: what the upstream processes again."""
    remaining = max(0, request.max_output_tokens - delivered)
    return request.prompt_tokens + delivered + remaining


def attempts(
    request: RequestInfo,
    *,
    budget: RetryBudget | None,
    now: float,
    policy: RetryPolicy | None = None,
    deadline_s: float | None = None,
    allow_continuation: bool = True,
    predicted_attempt_s: float = 0.0,
    rng: random.Random | None = None,
) -> RetryPlan:
    """Yield attempts for ``request`` and receive their outcomes; see the module docstring."""
    policy = policy or RetryPolicy()
    cost = first_attempt_cost(request)
    if budget is not None:
        budget.on_first_attempt(cost, now=now)
    tried: list[InstanceId] = []
    delivered = 0
    number = 1
    outcome = yield Attempt(1, AttemptKind.FIRST, frozenset(), 0.0, 0, cost)
    while True:
        if outcome.instance_id is not None:
            tried.append(outcome.instance_id)
        if outcome.result is AttemptResult.CLIENT_RESTART:
            delivered = 0
        else:
            delivered += max(0, outcome.tokens_delivered)
        end = _Ender(number, delivered, tuple(tried))
        if outcome.ok:
            return end(TerminalOutcome.COMPLETED, RetryReason.SUCCEEDED)
        t = outcome.at_s
        kind = AttemptKind.CONTINUATION if delivered > 0 else AttemptKind.RETRY
        if kind is AttemptKind.CONTINUATION and not allow_continuation:
            return end(TerminalOutcome.FAILED, RetryReason.CONTINUATION_DISABLED)
        if number >= policy.cap(kind):
            return end(TerminalOutcome.FAILED, RetryReason.ATTEMPTS_EXHAUSTED)
        delay = policy.delay_s(number, rng)
        if deadline_s is not None:
            if t >= deadline_s:
                return end(TerminalOutcome.FAILED, RetryReason.DEADLINE_PASSED)
            if t + delay + predicted_attempt_s > deadline_s:
                return end(TerminalOutcome.FAILED, RetryReason.DEADLINE_UNREACHABLE)
        again = retry_cost(request, delivered)
        if budget is not None:
            decision = budget.try_spend(again, now=t)
            if not decision.allowed:
                return end(TerminalOutcome.FAILED, decision.reason)
        number += 1
        outcome = yield Attempt(number, kind, frozenset(tried), delay, delivered, again)


class _Ender(msgspec.Struct, frozen=True):
    attempts: int
    delivered: int
    tried: tuple[InstanceId, ...]

    def __call__(self, terminal: TerminalOutcome, reason: RetryReason) -> PlanResult:
        return PlanResult(terminal, reason, self.attempts, self.delivered, self.tried)


def drive(plan: RetryPlan, execute: Callable[[Attempt], AttemptOutcome]) -> PlanResult:
    """Run a plan synchronously: ``execute`` performs one attempt and reports its outcome."""
    attempt = next(plan)
    while True:
        try:
            attempt = plan.send(execute(attempt))
        except StopIteration as stop:
            result: PlanResult = stop.value
            return result
