"""The KV working-set limit of task-aware admission: by table and by property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenplane.core.task_admission import (
    DEFAULT_KV_TARGET_FRACTION,
    KvWorkingSetLimit,
    WorkingSetDecision,
    WorkingSetReason,
    context_tokens,
    fleet_kv_capacity_tokens,
    peak_context_tokens,
    starts_reusable_task,
)
from tokenplane.core.views import InstanceView, RequestInfo, WorkflowContext

CAP = 1_000_000  # fleet KV capacity in tokens; budget at the default fraction 850_000


def req(step: int | None = 1, of: int | None = 5, prompt: int = 2_500, out: int = 300) -> RequestInfo:
    wf = None if step is None else WorkflowContext("w", step=step, total_steps=of)
    return RequestInfo("r", "m", prompt_tokens=prompt, max_output_tokens=out, workflow=wf)


# step 1 of 5, context 2,800, growth 1,800 per step: peak 2,800 + 4 x 1,800 = 10,000
NEW = req()
PEAK = 10_000
G = 1_800.0


@pytest.mark.parametrize(
    ("request_", "active", "capacity", "admit", "reason"),
    [
        (NEW, 0, CAP, True, WorkingSetReason.NO_ACTIVE_TASKS),
        (NEW, 840_000, CAP, True, WorkingSetReason.FITS),  # 850,000: exactly at the budget
        (NEW, 840_001, CAP, False, WorkingSetReason.OVER_BUDGET),
        (NEW, 5_000_000, CAP, False, WorkingSetReason.OVER_BUDGET),
        (NEW, 5_000_000, 0, True, WorkingSetReason.CAPACITY_UNKNOWN),  # fail open
        (req(prompt=2_000_000), 0, CAP, True, WorkingSetReason.NO_ACTIVE_TASKS),  # alone, it runs
        (req(prompt=2_000_000), 1, CAP, False, WorkingSetReason.OVER_BUDGET),
        (req(step=2), 5_000_000, CAP, True, WorkingSetReason.STARTED_TASK),
        (req(step=5), 5_000_000, CAP, True, WorkingSetReason.STARTED_TASK),
        (req(step=None), 5_000_000, CAP, True, WorkingSetReason.NO_REUSE),  # no workflow
        (req(step=1, of=1), 5_000_000, CAP, True, WorkingSetReason.NO_REUSE),  # one step: no reuse
        (req(step=1, of=None), 840_000, CAP, True, WorkingSetReason.FITS),  # unknown length: 2,800
        (req(step=1, of=None), 847_201, CAP, False, WorkingSetReason.OVER_BUDGET),
    ],
)
def test_decision_table(
    request_: RequestInfo, active: int, capacity: int, admit: bool, reason: WorkingSetReason
) -> None:
    d = KvWorkingSetLimit().decide(
        request_, active_context_tokens=active, kv_capacity_tokens=capacity, growth_per_step_tokens=G
    )
    assert (d.admit, d.reason) == (admit, reason)
    assert d.budget_tokens == int(DEFAULT_KV_TARGET_FRACTION * capacity)


def test_the_refusal_reason_is_a_stable_label() -> None:
    assert WorkingSetReason.OVER_BUDGET.value == "kv_working_set"


def test_the_new_task_counts_at_its_projected_peak() -> None:
    limit = KvWorkingSetLimit(0.5)
    assert limit.request_tokens(NEW, G) == PEAK
    assert limit.request_tokens(NEW) == context_tokens(NEW) == 2_800  # no growth known: as it is
    d = limit.decide(NEW, active_context_tokens=100, kv_capacity_tokens=CAP, growth_per_step_tokens=G)
    assert d.working_set_tokens == 100 + PEAK
    assert d.budget_tokens == 500_000


@pytest.mark.parametrize(
    ("current", "step", "total", "growth", "unknown", "peak"),
    [
        (2_800, 1, 5, 1_800.0, 0, 10_000),
        (8_200, 4, 5, 1_800.0, 0, 10_000),
        (10_000, 5, 5, 1_800.0, 0, 10_000),  # the last step: no growth left
        (10_000, 7, 5, 1_800.0, 0, 10_000),  # past the stated length: never shrinks
        (2_800, 1, None, 1_800.0, 0, 2_800),
        (2_800, 1, None, 1_800.0, 2, 6_400),
        (2_800, 1, 5, -5.0, 0, 2_800),  # negative growth counts as none
        (2_800, 1, 5, float("nan"), 0, 2_800),
        (-3, 1, 5, 0.0, 0, 0),
    ],
)
def test_peak_context_tokens(
    current: int, step: int, total: int | None, growth: float, unknown: int, peak: int
) -> None:
    assert peak_context_tokens(current, step, total, growth, unknown_remaining_steps=unknown) == peak


def test_fleet_capacity_counts_instances_that_take_work() -> None:
    views = [
        InstanceView("a", kv_capacity_tokens=400_000),
        InstanceView("b", kv_capacity_tokens=400_000, ready=False),
        InstanceView("c", kv_capacity_tokens=400_000, healthy=False),
        InstanceView("d", kv_capacity_tokens=300_000),
        InstanceView("e"),
    ]
    assert fleet_kv_capacity_tokens(views) == 700_000
    assert fleet_kv_capacity_tokens([]) == 0


def test_starts_reusable_task() -> None:
    assert starts_reusable_task(NEW)
    assert starts_reusable_task(req(step=1, of=None))
    assert not starts_reusable_task(req(step=2))
    assert not starts_reusable_task(req(step=1, of=1))
    assert not starts_reusable_task(req(step=None))


@pytest.mark.parametrize("bad", [0.0, -0.1, float("inf"), float("nan")])
def test_bad_fraction_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="target_fraction"):
        KvWorkingSetLimit(bad)


def test_bad_unknown_remaining_steps_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown_remaining_steps"):
        KvWorkingSetLimit(unknown_remaining_steps=-1)


# -- properties ------------------------------------------------------------------------------------

steps = st.one_of(st.none(), st.integers(min_value=0, max_value=50))
totals = st.one_of(st.none(), st.integers(min_value=1, max_value=50))
requests = st.builds(
    lambda step, total, prompt, out: RequestInfo(
        "r",
        "m",
        prompt_tokens=prompt,
        max_output_tokens=out,
        workflow=None if step is None else WorkflowContext("w", step=step, total_steps=total),
    ),
    steps,
    totals,
    st.integers(min_value=0, max_value=200_000),
    st.integers(min_value=0, max_value=20_000),
)
tokens = st.integers(min_value=-10, max_value=10_000_000)
fractions = st.floats(min_value=0.01, max_value=4.0)
growths = st.floats(min_value=-100.0, max_value=50_000.0)


@settings(max_examples=300, deadline=None)
@given(requests, tokens, tokens, fractions, growths)
def test_never_refuses_a_started_step_or_a_request_without_reuse(
    request_: RequestInfo, active: int, capacity: int, fraction: float, growth: float
) -> None:
    d = KvWorkingSetLimit(fraction).decide(
        request_, active_context_tokens=active, kv_capacity_tokens=capacity, growth_per_step_tokens=growth
    )
    wf = request_.workflow
    if wf is not None and wf.step > 1:
        assert d.admit and d.reason is WorkingSetReason.STARTED_TASK
    if not starts_reusable_task(request_):
        assert d.admit
    if not d.admit:
        assert d.reason is WorkingSetReason.OVER_BUDGET
        assert starts_reusable_task(request_)


@settings(max_examples=300, deadline=None)
@given(requests, tokens, tokens, fractions, growths)
def test_admits_exactly_when_the_working_set_fits(
    request_: RequestInfo, active: int, capacity: int, fraction: float, growth: float
) -> None:
    limit = KvWorkingSetLimit(fraction)
    d = limit.decide(
        request_, active_context_tokens=active, kv_capacity_tokens=capacity, growth_per_step_tokens=growth
    )
    fits = max(0, active) + limit.request_tokens(request_, growth) <= limit.budget_tokens(capacity)
    if starts_reusable_task(request_) and capacity > 0 and active > 0:
        assert d.admit == fits
    if fits:
        assert d.admit


@settings(max_examples=200, deadline=None)
@given(requests, tokens, tokens, tokens, fractions, growths)
def test_more_active_work_never_turns_a_refusal_into_an_admission(
    request_: RequestInfo, a: int, b: int, capacity: int, fraction: float, growth: float
) -> None:
    limit = KvWorkingSetLimit(fraction)
    lo, hi = sorted((max(1, a), max(1, b)))
    d_lo = limit.decide(
        request_, active_context_tokens=lo, kv_capacity_tokens=capacity, growth_per_step_tokens=growth
    )
    d_hi = limit.decide(
        request_, active_context_tokens=hi, kv_capacity_tokens=capacity, growth_per_step_tokens=growth
    )
    if not d_lo.admit:
        assert not d_hi.admit
    if d_hi.admit:
        assert d_lo.admit


@settings(max_examples=200, deadline=None)
@given(requests, tokens, tokens, fractions, growths)
def test_decisions_are_deterministic(
    request_: RequestInfo, active: int, capacity: int, fraction: float, growth: float
) -> None:
    def decide(r: RequestInfo) -> WorkingSetDecision:
        return KvWorkingSetLimit(fraction).decide(
            r, active_context_tokens=active, kv_capacity_tokens=capacity, growth_per_step_tokens=growth
        )

    copy = RequestInfo(
        request_.request_id,
        request_.model,
        request_.prompt_tokens,
        request_.max_output_tokens,
        workflow=request_.workflow,
    )
    assert decide(request_) == decide(request_) == decide(copy)
