"""Load shedding: reasons in order, batch before interactive, and the TTFT model."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenplane.core.admission import PriorityClass
from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.shedding import (
    LoadShedder,
    LoadSignal,
    ShedAction,
    ShedReason,
    ShedThresholds,
    TtftPredictor,
    load_signal,
)
from tokenplane.core.views import InstanceView

B, S, HI = PriorityClass.BATCH, PriorityClass.STANDARD, PriorityClass.INTERACTIVE


@pytest.mark.parametrize(
    ("priority", "signal", "deadline", "reason"),
    [
        (B, LoadSignal(0, 0.0, 0.0), None, ShedReason.UNDER_LIMITS),
        (B, LoadSignal(64, 0.0, 0.0), None, ShedReason.QUEUE_DEPTH),
        (S, LoadSignal(64, 0.0, 0.0), None, ShedReason.UNDER_LIMITS),
        (S, LoadSignal(10, 15.0, 0.0), None, ShedReason.QUEUE_WAIT),
        (HI, LoadSignal(10, 15.0, 0.0), None, ShedReason.UNDER_LIMITS),
        (HI, LoadSignal(0, 0.0, 3.0), 102.0, ShedReason.TTFT_OVER_BUDGET),
        (HI, LoadSignal(0, 0.0, 1.0), 102.0, ShedReason.UNDER_LIMITS),
        (HI, LoadSignal(0, 0.0, 0.0), 100.0, ShedReason.DEADLINE_PASSED),
    ],
)
def test_decisions(
    priority: PriorityClass, signal: LoadSignal, deadline: float | None, reason: ShedReason
) -> None:
    d = LoadShedder().decide(priority, signal, now=100.0, deadline_s=deadline)
    assert d.reason is reason
    assert d.shed == (reason is not ShedReason.UNDER_LIMITS)
    assert d.action is (ShedAction.KEEP if reason is ShedReason.UNDER_LIMITS else ShedAction.SHED)


@given(
    depth=st.integers(0, 3000),
    wait=st.floats(0, 100),
    ttft=st.floats(0, 100),
    deadline=st.one_of(st.none(), st.floats(0, 200)),
)
def test_lower_priority_sheds_first(depth: int, wait: float, ttft: float, deadline: float | None) -> None:
    shedder = LoadShedder()
    signal = LoadSignal(depth, wait, ttft)
    shed = [shedder.decide(c, signal, now=50.0, deadline_s=deadline).shed for c in (B, S, HI)]
    # monotone: once a class is kept, every higher class is kept
    assert shed == sorted(shed, reverse=True)


def test_thresholds_must_not_decrease_with_priority() -> None:
    with pytest.raises(InvalidPolicyConfig):
        LoadShedder({B: ShedThresholds(max_queue_depth=2000)})
    never = LoadShedder({HI: ShedThresholds(math.inf, math.inf)})
    assert not never.decide(HI, LoadSignal(10**9, 1e9, 0.0), now=0.0).shed


def test_from_params() -> None:
    s = LoadShedder.from_params({"thresholds": {"batch": {"max_queue_depth": 8}}})
    assert s.thresholds[B].max_queue_depth == 8 and s.thresholds[B].max_queue_wait_s == 5.0
    for bad in ({"thresholds": {"urgent": {}}}, {"thresholds": {"batch": {"depth": 1}}}, {"x": 1}):
        with pytest.raises(InvalidPolicyConfig):
            LoadShedder.from_params(bad)


def test_ttft_model() -> None:
    p = TtftPredictor(mean_prefill_s=0.5, prefill_tokens_per_s=1000.0)
    views = [
        InstanceView("a", waiting=4),
        InstanceView("b", waiting=2),
        InstanceView("c", waiting=0, healthy=False),
    ]
    # best usable is b: (2 + 4/2) × 0.5 + 500/1000
    assert p.predict(views, queue_depth=4, prompt_tokens=500) == pytest.approx(2.5)
    assert p.predict([InstanceView("x", ready=False)]) == math.inf
    sig = load_signal(views, queue_depth=4, oldest_wait_s=1.0, predictor=p, prompt_tokens=500)
    assert sig == LoadSignal(4, 1.0, pytest.approx(2.5))


def test_ttft_predictor_learns() -> None:
    p = TtftPredictor(mean_prefill_s=0.0, alpha=0.5)
    p.observe(3.0, waiting_ahead=2)  # one prefill = 1.0 s
    assert p.mean_prefill_s == pytest.approx(0.5)
    p.observe(float("nan"), waiting_ahead=0)
    assert p.mean_prefill_s == pytest.approx(0.5)
