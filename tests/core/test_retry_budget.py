"""Retry budgets (requests and tokens) and the retry plan generator."""

from __future__ import annotations

import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.outcomes import AttemptOutcome, AttemptResult, TerminalOutcome
from tokenplane.core.retry_budget import (
    Attempt,
    AttemptKind,
    ContinuationSwitch,
    RetryBudget,
    RetryPolicy,
    RetryReason,
    attempts,
    drive,
    first_attempt_cost,
    retry_cost,
)
from tokenplane.core.state_store import SlidingWindowCounterStore
from tokenplane.core.views import RequestInfo

OK = AttemptResult.OK
BEFORE = AttemptResult.FAILED_BEFORE_FIRST_BYTE
MID = AttemptResult.FAILED_MID_STREAM


def budget(
    ratio: float = 0.2, min_per_s: float = 0.0, min_tokens_per_s: float = 1e12, window: float = 10.0
) -> RetryBudget:
    store = SlidingWindowCounterStore(window)
    return RetryBudget(store, ratio=ratio, min_per_s=min_per_s, min_tokens_per_s=min_tokens_per_s)


def req(prompt: int = 100, out: int = 50) -> RequestInfo:
    return RequestInfo("r", "m", prompt_tokens=prompt, max_output_tokens=out)


@pytest.mark.parametrize(
    ("firsts", "ratio", "floor", "allowed_retries"),
    [(10, 0.2, 0.0, 2), (10, 0.0, 0.0, 0), (0, 0.2, 0.1, 1), (100, 0.1, 0.0, 10), (5, 0.5, 0.2, 4)],
)
def test_request_budget(firsts: int, ratio: float, floor: float, allowed_retries: int) -> None:
    b = budget(ratio=ratio, min_per_s=floor)
    for _ in range(firsts):
        b.on_first_attempt(100, now=0.0)
    granted = sum(b.try_spend(100, now=1.0).allowed for _ in range(50))
    assert granted == allowed_retries
    assert b.try_spend(100, now=1.0).reason is RetryReason.BUDGET_REQUESTS


def test_token_budget_refuses_a_big_retry() -> None:
    b = RetryBudget(
        SlidingWindowCounterStore(10.0), ratio=1.0, min_per_s=0.0, token_ratio=0.2, min_tokens_per_s=0.0
    )
    for _ in range(10):
        b.on_first_attempt(1_000, now=0.0)  # 10k tokens -> 2k retry tokens
    assert b.try_spend(50_000, now=0.0).reason is RetryReason.BUDGET_TOKENS
    assert b.try_spend(1_500, now=0.0).allowed
    assert b.try_spend(1_000, now=0.0).reason is RetryReason.BUDGET_TOKENS


def test_window_slides() -> None:
    b = budget(ratio=0.5, window=10.0)
    for _ in range(4):
        b.on_first_attempt(10, now=0.0)
    assert b.try_spend(10, now=1.0).allowed and b.try_spend(10, now=1.0).allowed
    assert not b.try_spend(10, now=1.0).allowed
    assert not b.try_spend(10, now=10.5).allowed  # firsts gone, retries still counted: in debt
    assert b.balance(now=10.5)[0] < 0
    b.on_first_attempt(10, now=12.0)
    b.on_first_attempt(10, now=12.0)
    assert b.try_spend(10, now=12.0).allowed  # old retries left at 11


def test_from_params() -> None:
    b = RetryBudget.from_params({"ratio": 0.1, "window_s": 5})
    assert b.ratio == 0.1 and b.token_ratio == 0.1
    for bad in ({"ratio": -1}, {"window_s": 0}, {"rato": 1}):
        with pytest.raises(InvalidPolicyConfig):
            RetryBudget.from_params(bad)
    assert RetryPolicy.from_params({"max_attempts": 2}).max_attempts == 2
    with pytest.raises(InvalidPolicyConfig):
        RetryPolicy.from_params({"max_attempts": 0})


def in_window(log: list[tuple[float, int]], now: float, window: float) -> list[int]:
    return [c for t, c in log if now - window < t <= now]


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 3.0), st.booleans(), st.integers(1, 5000)),
        max_size=120,
    ),
    st.floats(0.0, 1.0),
    st.floats(0.0, 0.5),
)
def test_budget_never_overspent(steps: list[tuple[float, bool, int]], ratio: float, floor: float) -> None:
    window = 10.0
    store = SlidingWindowCounterStore(window)
    b = RetryBudget(store, ratio=ratio, min_per_s=floor, min_tokens_per_s=100.0)
    now = 0.0
    firsts: list[tuple[float, int]] = []
    retries: list[tuple[float, int]] = []
    for dt, is_first, cost in steps:
        now += dt
        if is_first:
            b.on_first_attempt(cost, now=now)
            firsts.append((now, cost))
        elif b.try_spend(cost, now=now).allowed:
            retries.append((now, cost))
            req_balance, tok_balance = b.balance(now=now)
            assert req_balance >= -1e-9 and tok_balance >= -1e-6  # never negative at a spend

            recent_retries = in_window(retries, now, window)
            recent_firsts = in_window(firsts, now, window)
            assert len(recent_retries) <= ratio * len(recent_firsts) + floor * window + 1e-9
            assert sum(recent_retries) <= ratio * sum(recent_firsts) + 100.0 * window + 1e-6


def run_plan(
    outcomes: list[AttemptOutcome], *, b: RetryBudget | None = None, **kw: object
) -> tuple[list[Attempt], object]:
    seen: list[Attempt] = []
    queue = list(outcomes)

    def execute(a: Attempt) -> AttemptOutcome:
        seen.append(a)
        return queue.pop(0)

    plan = attempts(req(), budget=b or budget(ratio=1.0, min_per_s=1.0), now=0.0, **kw)  # type: ignore[arg-type]
    return seen, drive(plan, execute)


def test_first_attempt_succeeds() -> None:
    seen, result = run_plan([AttemptOutcome(OK, "a", 50, 1.0)])
    assert [a.kind for a in seen] == [AttemptKind.FIRST]
    assert result.terminal is TerminalOutcome.COMPLETED and result.tokens_delivered == 50  # type: ignore[attr-defined]


def test_retry_moves_to_another_instance_then_continuation() -> None:
    seen, result = run_plan(
        [
            AttemptOutcome(BEFORE, "a", 0, 1.0),
            AttemptOutcome(MID, "b", 20, 2.0),
            AttemptOutcome(OK, "c", 30, 3.0),
        ],
        policy=RetryPolicy(max_attempts=3, backoff_base_s=0.1),
    )
    assert [(a.kind, a.exclude, a.resume_tokens) for a in seen] == [
        (AttemptKind.FIRST, frozenset(), 0),
        (AttemptKind.RETRY, frozenset({"a"}), 0),
        (AttemptKind.CONTINUATION, frozenset({"a", "b"}), 20),
    ]
    assert [a.delay_s for a in seen] == [0.0, 0.1, 0.2]
    assert seen[2].is_continuation and seen[2].cost_tokens == 100 + 20 + 30
    assert result.terminal is TerminalOutcome.COMPLETED and result.tokens_delivered == 50  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("outcomes", "kw", "reason"),
    [
        (
            [AttemptOutcome(MID, "a", 5, 1.0)],
            {"allow_continuation": False},
            RetryReason.CONTINUATION_DISABLED,
        ),
        (
            [AttemptOutcome(BEFORE, "a", 0, 1.0)] * 2,
            {"policy": RetryPolicy(max_attempts=2)},
            RetryReason.ATTEMPTS_EXHAUSTED,
        ),
        (
            [AttemptOutcome(AttemptResult.TIMEOUT, "a", 0, 5.0)],
            {"deadline_s": 5.0},
            RetryReason.DEADLINE_PASSED,
        ),
        (
            [AttemptOutcome(BEFORE, "a", 0, 4.0)],
            {"deadline_s": 5.0, "predicted_attempt_s": 2.0},
            RetryReason.DEADLINE_UNREACHABLE,
        ),
    ],
)
def test_plan_stops(outcomes: list[AttemptOutcome], kw: dict[str, object], reason: RetryReason) -> None:
    _, result = run_plan(outcomes, **kw)
    assert result.terminal is TerminalOutcome.FAILED and result.reason is reason  # type: ignore[attr-defined]


def test_plan_stops_on_empty_budget() -> None:
    _, result = run_plan([AttemptOutcome(BEFORE, "a", 0, 1.0)], b=budget(ratio=0.0))
    assert result.reason is RetryReason.BUDGET_REQUESTS  # type: ignore[attr-defined]


def test_jitter_uses_the_rng_handed_in() -> None:
    outcomes = [AttemptOutcome(BEFORE, "a", 0, 1.0), AttemptOutcome(OK, "b", 1, 2.0)]
    s1, _ = run_plan(outcomes, rng=random.Random(7))
    s2, _ = run_plan(outcomes, rng=random.Random(7))
    assert s1 == s2 and 0.0 <= s1[1].delay_s <= 0.05


def test_continuation_switch() -> None:
    switch = ContinuationSwitch(default=True, tenants={"no-resume": False})
    assert switch.allowed("x") and not switch.allowed("no-resume")


@given(n=st.integers(1, 300), ratio=st.floats(0.0, 0.5), floor=st.floats(0.0, 0.5))
@example(n=92, ratio=1 / 3, floor=1 / 3)  # a sum that rounds below the budget's own
def test_all_failing_attempts_stay_under_budget(n: int, ratio: float, floor: float) -> None:
    window = 10.0
    b = budget(ratio=ratio, min_per_s=floor, window=window)
    upstream = 0
    for i in range(n):
        t = i * 0.01  # all inside one window

        def fail(a: Attempt, t: float = t) -> AttemptOutcome:
            nonlocal upstream
            upstream += 1
            return AttemptOutcome(BEFORE, f"i{a.number}", 0, t)

        drive(attempts(req(), budget=b, now=t, policy=RetryPolicy(max_attempts=5)), fail)
    retries = upstream - n
    # The budget's own bound; the tolerance is for the float sum (92 first attempts at a ratio of
    # 1/3 with a floor of 1/3 over 10 s allow 34 retries, and 92 * (1 + 1/3) + 10/3 rounds to
    # 125.99999999999999).
    assert retries <= ratio * n + floor * window + 1e-9


# -- what the twin's clients need of the plan ---------------------------------------------------


def test_client_restart_discards_delivered_tokens() -> None:
    # 20 tokens reached the client, then it gave up and re-sent: the next attempt is a fresh RETRY
    seen, result = run_plan(
        [
            AttemptOutcome(MID, "a", 20, 1.0),
            AttemptOutcome(AttemptResult.CLIENT_RESTART, "b", 5, 2.0),
            AttemptOutcome(OK, "c", 50, 3.0),
        ],
        policy=RetryPolicy(max_attempts=3, backoff_base_s=0.0),
    )
    assert [(a.kind, a.resume_tokens, a.cost_tokens) for a in seen] == [
        (AttemptKind.FIRST, 0, 150),
        (AttemptKind.CONTINUATION, 20, 150),
        (AttemptKind.RETRY, 0, 150),
    ]
    assert result.tokens_delivered == 50  # type: ignore[attr-defined]


def test_continuations_may_have_their_own_cap() -> None:
    lost = [AttemptOutcome(MID, x, 1, float(i)) for i, x in enumerate("abcd")]
    policy = RetryPolicy(max_attempts=1, backoff_base_s=0.0, max_continuation_attempts=5)
    seen, result = run_plan([*lost, AttemptOutcome(OK, "e", 1, 9.0)], policy=policy)
    assert [a.kind for a in seen[1:]] == [AttemptKind.CONTINUATION] * 4
    assert result.reason is RetryReason.SUCCEEDED  # type: ignore[attr-defined]
    # a retry (nothing delivered) is still capped by max_attempts
    _, result = run_plan([AttemptOutcome(BEFORE, "a", 0, 1.0)], policy=policy)
    assert result.reason is RetryReason.ATTEMPTS_EXHAUSTED  # type: ignore[attr-defined]
    assert RetryPolicy.from_params({"max_continuation_attempts": 7}).max_continuation_attempts == 7
    assert RetryPolicy.from_params({}).max_continuation_attempts is None


def test_no_budget_plans_without_one() -> None:
    outcomes = iter([AttemptOutcome(BEFORE, x, 0, 1.0) for x in "abc"])
    plan = attempts(req(), budget=None, now=0.0, policy=RetryPolicy(max_attempts=3))
    result = drive(plan, lambda _attempt: next(outcomes))
    assert result.reason is RetryReason.ATTEMPTS_EXHAUSTED and result.attempts == 3


def test_costs_are_the_ones_both_shells_charge() -> None:
    r = req(prompt=100, out=50)
    assert first_attempt_cost(r) == 150
    assert retry_cost(r, 0) == 150
    assert retry_cost(r, 20) == 150  # prompt + delivered + remaining
    assert retry_cost(r, 80) == 180  # delivered past max_output: nothing remains
