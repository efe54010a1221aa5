"""Cost attribution and task economics: hand-computed figures and invariants."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenplane.core.economics import (
    InvalidCostInput,
    OutcomeTotals,
    TaskCost,
    TaskOutcome,
    attempt_cost,
    cost_per_million_tokens,
    cost_per_successful_task,
    split_interval_cost,
    success_per_dollar,
    summarize,
    summarize_by,
    summarize_totals,
    token_costs,
)


def test_token_costs_from_price_and_throughput() -> None:
    # $3.60/h = $0.001/s; 10,000 prefill tok/s and 1,000 decode tok/s.
    c = token_costs(3.6, prefill_tokens_per_s=10_000, decode_tokens_per_s=1_000)
    assert c.prefill_usd_per_token == pytest.approx(1e-7)
    assert c.decode_usd_per_token == pytest.approx(1e-6)
    # 2,000 prompt tokens computed (say 500 of 2,500 were cache hits) and 300 output tokens.
    assert attempt_cost(c, prompt_tokens_computed=2_000, output_tokens=300) == pytest.approx(2e-4 + 3e-4)


def test_one_second_of_instance_time_costs_its_price() -> None:
    # Exact by construction: the tokens one busy second buys cost one second of the instance.
    c = token_costs(2.99, prefill_tokens_per_s=12_345, decode_tokens_per_s=2_345)
    prefill_second = attempt_cost(c, prompt_tokens_computed=12_345, output_tokens=0)
    decode_second = attempt_cost(c, prompt_tokens_computed=0, output_tokens=2_345)
    assert prefill_second == pytest.approx(2.99 / 3600)
    assert decode_second == pytest.approx(2.99 / 3600)


@pytest.mark.parametrize(
    ("price", "prefill", "decode"),
    [(-1.0, 1.0, 1.0), (1.0, 0.0, 1.0), (1.0, 1.0, -5.0), (math.nan, 1.0, 1.0), (1.0, math.inf, 1.0)],
)
def test_token_costs_rejects_nonsense(price: float, prefill: float, decode: float) -> None:
    with pytest.raises(InvalidCostInput):
        token_costs(price, prefill_tokens_per_s=prefill, decode_tokens_per_s=decode)


def test_attempt_cost_rejects_negative_tokens() -> None:
    c = token_costs(1.0, prefill_tokens_per_s=1.0, decode_tokens_per_s=1.0)
    with pytest.raises(InvalidCostInput):
        attempt_cost(c, prompt_tokens_computed=-1, output_tokens=0)


@given(
    cost=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    tokens=st.dictionaries(st.text(min_size=1, max_size=4), st.integers(0, 10**6), max_size=20),
)
def test_split_interval_cost_sums_to_the_interval(cost: float, tokens: dict[str, int]) -> None:
    parts = split_interval_cost(cost, tokens)
    if sum(tokens.values()) == 0:
        assert parts == {}
    else:
        assert math.fsum(parts.values()) == pytest.approx(cost, rel=1e-9, abs=1e-12)
        assert all(v >= 0 for v in parts.values())


def test_split_interval_cost_is_proportional() -> None:
    assert split_interval_cost(1.0, {"a": 3, "b": 1, "c": 0}) == {"a": 0.75, "b": 0.25, "c": 0.0}


def _task(wid: str, outcome: TaskOutcome, cost: float, **kw: object) -> TaskCost:
    return TaskCost(workflow_id=wid, tenant=str(kw.pop("tenant", "t")), outcome=outcome, cost_usd=cost, **kw)  # type: ignore[arg-type]


def test_failed_tasks_are_paid_for_by_the_successful_ones() -> None:
    # Request R: steps 1 and 2 cost X + Y, step 3 fails and ends the task: all of it is lost.
    tasks = [
        _task(
            "ok1",
            TaskOutcome.SUCCEEDED,
            1.0,
            attempts=5,
            failed_attempts=1,
            failed_attempt_cost_usd=0.2,
            tokens_in=900,
            tokens_out=100,
        ),
        _task("ok2", TaskOutcome.SUCCEEDED, 1.0, attempts=5, tokens_in=900, tokens_out=100),
        _task(
            "r",
            TaskOutcome.FAILED,
            0.6,
            attempts=3,
            failed_attempts=1,
            failed_attempt_cost_usd=0.1,
            tokens_in=500,
            tokens_out=100,
        ),
        _task("gone", TaskOutcome.ABANDONED, 0.4, attempts=2, tokens_in=300, tokens_out=100),
        _task("live", TaskOutcome.OPEN, 9.0, attempts=1),
    ]
    s = summarize(tasks)
    assert s.tasks_completed == 2
    assert s.tasks_failed == 2  # failed + abandoned
    assert s.tasks_abandoned == 1
    assert s.tasks_open == 1
    assert s.cost_usd == pytest.approx(3.0)  # open task excluded
    assert s.cost_open_usd == pytest.approx(9.0)
    assert s.cost_per_successful_task == pytest.approx(1.5)
    assert s.success_per_dollar == pytest.approx(2 / 3)
    assert s.wasted_cost_usd == pytest.approx(0.2 + 0.6 + 0.4)
    assert s.tokens == 3_000
    assert s.cost_per_million_tokens == pytest.approx(1_000.0)
    assert s.attempts == 15
    assert s.failed_attempts == 2
    assert s.tasks_settled == 4
    assert set(s.as_dict()) >= {
        "tasks_completed",
        "tasks_failed",
        "cost_per_successful_task",
        "success_per_dollar",
    }


def test_undefined_ratios_are_none() -> None:
    s = summarize([_task("x", TaskOutcome.FAILED, 1.0)])
    assert s.cost_per_successful_task is None
    assert s.cost_per_million_tokens is None
    assert s.success_per_dollar == 0.0
    empty = summarize([])
    assert empty.success_per_dollar is None
    assert empty.tasks_completed == 0
    assert cost_per_successful_task(1.0, 0) is None
    assert success_per_dollar(3, 0.0) is None
    assert cost_per_million_tokens(1.0, 0) is None


def test_summarize_by_tenant_and_model() -> None:
    tasks = [
        _task("a", TaskOutcome.SUCCEEDED, 1.0, tenant="acme", model="m1"),
        _task("b", TaskOutcome.FAILED, 1.0, tenant="acme", model="m2"),
        _task("c", TaskOutcome.SUCCEEDED, 2.0, tenant="beta", model="m1"),
    ]
    by_tenant = summarize_by(tasks, lambda t: t.tenant)
    assert by_tenant["acme"].cost_per_successful_task == pytest.approx(2.0)
    assert by_tenant["beta"].cost_per_successful_task == pytest.approx(2.0)
    by_model = summarize_by(tasks, lambda t: t.model)
    assert by_model["m1"].tasks_completed == 2
    assert by_model["m2"].tasks_failed == 1


@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(TaskOutcome)), st.floats(0, 100, allow_nan=False), st.integers(0, 10**6)
        ),
        max_size=30,
    )
)
def test_summarize_equals_summarize_totals(rows: list[tuple[TaskOutcome, float, int]]) -> None:
    tasks = [_task(str(i), o, c, tokens_in=n) for i, (o, c, n) in enumerate(rows)]
    totals: dict[TaskOutcome, OutcomeTotals] = {}
    for o in TaskOutcome:
        mine = [t for t in tasks if t.outcome is o]
        totals[o] = OutcomeTotals(
            len(mine), sum(t.cost_usd for t in mine), 0.0, sum(t.tokens_in for t in mine)
        )
    a, b = summarize(tasks), summarize_totals(totals)
    assert a.tasks_completed == b.tasks_completed
    assert a.tasks_failed == b.tasks_failed
    assert a.cost_usd == pytest.approx(b.cost_usd)
    if a.cost_per_successful_task is not None:
        assert a.cost_per_successful_task == pytest.approx(b.cost_per_successful_task)
    assert a.cost_usd >= 0
