"""Workflow value: stakes, shedding order and retry decisions, by table and by property."""

from __future__ import annotations

import functools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.views import RequestInfo, WorkflowContext
from tokenplane.core.workflow_value import (
    DEFAULT_MODEL,
    WorkflowValueModel,
    compare_for_shedding,
    retry_worth,
    stake,
)

TOKENS = 1000  # 900 prompt + 100 output
C = TOKENS * 0.2 / 1e6  # one step's cost at the default price


def r(step: int | None = None, of: int | None = None, sunk_steps: float = 0.0, **wf: object) -> RequestInfo:
    workflow = None
    if step is not None:
        workflow = WorkflowContext("w", step=step, total_steps=of, sunk_cost_usd=sunk_steps * C, **wf)  # type: ignore[arg-type]
    return RequestInfo("r", "m", prompt_tokens=900, max_output_tokens=100, workflow=workflow)


SINGLE = r()
NEW_TASK = r(1, 5)
R_STEP_3 = r(3, 5, sunk_steps=2)
LAST_STEP = r(5, 5, sunk_steps=4)
LONG_SHOT = r(2, 40, sunk_steps=1)


@pytest.mark.parametrize(
    ("request_", "density"),
    [
        (SINGLE, 2 * 0.95 - 1),  # value_multiple × p − 1
        (NEW_TASK, 2 * 5 * 0.95**5 - 5),
        (R_STEP_3, 2 * 5 * 0.95**3 - 3),
        (LAST_STEP, 2 * 5 * 0.95 - 1),
        (LONG_SHOT, 2 * 40 * 0.95**39 - 39),
        (r(3, None, sunk_steps=2), 2 * 3 * 0.95 - 1),  # unknown length: treated as the last step
    ],
)
def test_density_table(request_: RequestInfo, density: float) -> None:
    s = DEFAULT_MODEL.assess(request_)
    assert s.density == pytest.approx(density)
    assert stake(request_) == pytest.approx(density * C)


def test_shedding_order_is_an_expected_value_comparison_not_a_step_rule() -> None:
    pool = [LAST_STEP, SINGLE, R_STEP_3, LONG_SHOT, NEW_TASK]
    victims_first = sorted(pool, key=functools.cmp_to_key(compare_for_shedding))
    assert victims_first == [LONG_SHOT, SINGLE, NEW_TASK, R_STEP_3, LAST_STEP]
    assert compare_for_shedding(SINGLE, LAST_STEP) == -1  # new cheap work goes before step 5 of 5
    assert compare_for_shedding(LONG_SHOT, SINGLE) == -1  # ... but a late-ish long shot goes first
    assert compare_for_shedding(SINGLE, r()) == 0


def test_a_step_past_its_deadline_is_shed_first() -> None:
    late = r(5, 5, sunk_steps=4, deadline_s=10.0)
    assert DEFAULT_MODEL.assess(late, now=20.0).p_finish == 0.0
    assert compare_for_shedding(late, SINGLE, now=20.0) == -1
    assert compare_for_shedding(late, SINGLE, now=5.0) == 1
    assert compare_for_shedding(late, SINGLE) == 1  # without a clock the deadline is not checked


def test_bigger_step_of_the_same_kind_is_not_preferred_for_shedding() -> None:
    big = RequestInfo("big", "m", prompt_tokens=90_000, max_output_tokens=10_000)
    assert compare_for_shedding(big, SINGLE) == 0  # same density: capacity freed scales with value lost


@pytest.mark.parametrize(
    ("request_", "attempt_cost", "p_success", "worth"),
    [
        (LAST_STEP, C, 0.2, True),  # 0.2 × 10c > c: saving a five-step task is worth a long shot
        (LAST_STEP, C, 0.05, False),
        (SINGLE, C, 0.6, True),  # 0.6 × 2c > c
        (SINGLE, C, 0.4, False),
        (NEW_TASK, C, 0.3, True),  # 0.3 × (0.95^4 × 10c − 4c) = 1.24c > c
        (NEW_TASK, C, 0.2, False),
        (LONG_SHOT, C, 1.0, False),  # the rest of a forty-step task is not worth paying for
        (LAST_STEP, 0.0, 0.01, True),
        (LAST_STEP, C, 0.0, False),
    ],
)
def test_retry_worth(request_: RequestInfo, attempt_cost: float, p_success: float, worth: bool) -> None:
    assert retry_worth(request_, attempt_cost, p_success) is worth


def test_no_retry_after_the_deadline() -> None:
    late = r(5, 5, sunk_steps=4, deadline_s=10.0)
    assert retry_worth(late, C, 0.9, now=5.0)
    assert not retry_worth(late, C, 0.9, now=11.0)


def test_sunk_cost_raises_what_is_at_stake() -> None:
    cheap_past = r(3, 5, sunk_steps=0.2)
    dear_past = r(3, 5, sunk_steps=20)
    assert stake(dear_past) > stake(cheap_past)
    assert retry_worth(dear_past, 5 * C, 0.5) and not retry_worth(cheap_past, 5 * C, 0.5)


@pytest.mark.parametrize(
    ("attempt_cost", "p_success"), [(-1.0, 0.5), (math.nan, 0.5), (math.inf, 0.5), (C, 1.5), (C, math.nan)]
)
def test_retry_worth_rejects_bad_inputs(attempt_cost: float, p_success: float) -> None:
    with pytest.raises(ValueError):
        retry_worth(SINGLE, attempt_cost, p_success)


def test_model_params() -> None:
    model = WorkflowValueModel.from_params({"value_multiple": 4.0, "p_step_success": 1.0})
    assert model.assess(SINGLE).density == pytest.approx(3.0)
    assert stake(SINGLE, model=model) == pytest.approx(3 * C)
    assert compare_for_shedding(SINGLE, LAST_STEP, model=model) == -1
    assert retry_worth(SINGLE, C, 0.3, model=model)
    unknown = WorkflowValueModel(unknown_remaining_steps=2).assess(r(3, None, sunk_steps=2))
    assert unknown.steps_after == 2


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"p_step_success": 0}, "p_step_success"),
        ({"p_step_success": 1.2}, "p_step_success"),
        ({"value_multiple": -1}, "value_multiple"),
        ({"usd_per_million_tokens": 0}, "usd_per_million_tokens"),
        ({"unknown_remaining_steps": -1}, "unknown_remaining_steps"),
        ({"typo": 1}, "unknown params"),
    ],
)
def test_bad_params(params: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidPolicyConfig, match=message):
        WorkflowValueModel.from_params(params)


workflows = st.none() | st.builds(
    WorkflowContext,
    workflow_id=st.just("w"),
    step=st.integers(-1, 60),
    total_steps=st.none() | st.integers(0, 60),
    sunk_cost_usd=st.floats(allow_nan=True, allow_infinity=False) | st.just(math.inf),
    deadline_s=st.none() | st.floats(-100, 100),
)
requests = st.builds(
    RequestInfo,
    request_id=st.just("r"),
    model=st.just("m"),
    prompt_tokens=st.integers(-10, 200_000),
    max_output_tokens=st.integers(-10, 20_000),
    workflow=workflows,
)


@settings(max_examples=300, deadline=None)
@given(a=requests, b=requests, c=requests, now=st.none() | st.floats(-100, 100))
def test_comparator_is_a_consistent_total_preorder(
    a: RequestInfo, b: RequestInfo, c: RequestInfo, now: float | None
) -> None:
    cmp = functools.partial(compare_for_shedding, now=now)
    assert cmp(a, b) == -cmp(b, a)
    assert cmp(a, a) == 0
    if cmp(a, b) <= 0 and cmp(b, c) <= 0:
        assert cmp(a, c) <= 0
    for req in (a, b, c):
        s = DEFAULT_MODEL.assess(req, now=now)
        assert 0.0 <= s.p_finish <= 1.0
        assert s.step_cost_usd > 0 and s.cost_to_finish_usd >= s.step_cost_usd
        assert not math.isnan(s.stake_usd)


@settings(max_examples=200, deadline=None)
@given(request=requests, cost=st.floats(0, 1), p1=st.floats(0, 1), p2=st.floats(0, 1))
def test_retry_is_monotone_in_its_odds(request: RequestInfo, cost: float, p1: float, p2: float) -> None:
    lo, hi = sorted((p1, p2))
    if retry_worth(request, cost, lo):
        assert retry_worth(request, cost, hi)
    assert not retry_worth(request, cost, 0.0)
