"""The core's pool TTFT model, the views' free KV bytes, and the one up-front TTFT rule."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from tokenplane.core.admission import AdmissionQueue, PriorityClass
from tokenplane.core.shedding import LoadShedder, TtftPredictor
from tokenplane.core.ttft import (
    TTFT_REPUBLISH_MIN_S,
    PoolTtft,
    UpFront,
    UpFrontReason,
    free_kv_bytes,
    ttft_up_front,
)
from tokenplane.core.views import InstanceView, RequestInfo

VIEWS = [InstanceView("a", waiting=4), InstanceView("b", waiting=9)]


def _info(budget: float | None, prompt: int = 1000, now: float = 100.0) -> RequestInfo:
    return RequestInfo("r", "m", prompt, 16, arrival_s=now, latency_budget_s=budget)


def _pool(mean: float = 0.2) -> PoolTtft:
    pool = PoolTtft(TtftPredictor(mean_prefill_s=mean))
    pool.observe(mean, 0, now=0.0)  # one first token, at the mean: it predicts from now on
    return pool


def _decide(pool: PoolTtft, info: RequestInfo, views: list[InstanceView], now: float = 100.0) -> UpFront:
    queue = AdmissionQueue.from_params({})
    return ttft_up_front(pool, lambda: views, info, PriorityClass.STANDARD, queue, LoadShedder(), now=now)


def test_nothing_is_predicted_before_the_first_observation_and_the_views_are_not_read() -> None:
    def no_views() -> list[InstanceView]:
        raise AssertionError("views read before the pool predicts")

    up = ttft_up_front(
        PoolTtft(), no_views, _info(0.01), PriorityClass.STANDARD, AdmissionQueue.from_params({}),
        LoadShedder(), now=100.0,
    )  # fmt: skip
    assert not up.shed and up.reason is UpFrontReason.NO_PREDICTION


def test_each_reason() -> None:
    # min over instances: 4 waiting x 0.2 s + 1000 tokens / 10k tokens/s = 0.9 s
    over = _decide(_pool(), _info(0.5), VIEWS)
    assert (over.shed, over.reason) == (True, UpFrontReason.TTFT_OVER_BUDGET)
    assert math.isclose(over.predicted_ttft_s, 0.9) and over.deadline_s == 100.5
    within = _decide(_pool(), _info(1.0), VIEWS)
    assert (within.shed, within.reason) == (False, UpFrontReason.WITHIN_BUDGET)
    gone = _decide(_pool(), _info(0.5), [InstanceView("a", healthy=False), InstanceView("b", ready=False)])
    assert (gone.shed, gone.reason) == (False, UpFrontReason.NO_USABLE_INSTANCE)
    late = _decide(_pool(), _info(0.5, now=90.0), VIEWS)  # its deadline passed: the queue answers
    assert (late.shed, late.reason) == (False, UpFrontReason.LEFT_TO_QUEUE)


@given(
    waiting=st.lists(st.integers(0, 50), min_size=1, max_size=4),
    mean=st.floats(0.001, 2.0),
    budget=st.floats(0.01, 60.0),
    prompt=st.integers(1, 50_000),
)
def test_shed_exactly_when_the_prediction_misses_the_deadline(
    waiting: list[int], mean: float, budget: float, prompt: int
) -> None:
    views = [InstanceView(str(i), waiting=w) for i, w in enumerate(waiting)]
    up = _decide(_pool(mean), _info(budget, prompt), views)
    predicted = min(waiting) * mean + prompt / 10_000.0
    assert math.isclose(up.predicted_ttft_s, predicted)
    assert up.shed == (100.0 + up.predicted_ttft_s > 100.0 + budget)


def test_the_pool_publishes_a_new_mean_only_when_it_moved_enough() -> None:
    pool = PoolTtft(TtftPredictor(mean_prefill_s=0.2, alpha=0.1))
    assert pool.view_ttft_s(3, "warm") == 0.0 and not pool.has_observed()
    pool.observe(0.8, 3, now=10.0)  # sample 0.2: the mean stays, and is published (the first one)
    assert pool.version == 1 and pool.view_ttft_s(3, "warm") == 0.8
    assert pool.view_ttft_s(3, "cold") == 0.0 and pool.view_ttft_s(3, "warming") == 0.0
    pool.observe(0.2 * 1.1, 0, now=20.0)  # moves the mean by 1 %: not republished
    assert pool.version == 1 and pool.mean_prefill_s == 0.2
    pool.observe(2.0, 0, now=20.0 + TTFT_REPUBLISH_MIN_S)  # by 90 %
    assert pool.version == 2 and pool.mean_prefill_s > 0.2
    moved = pool.predictor.mean_prefill_s
    pool.observe(20.0, 0, now=20.5 + TTFT_REPUBLISH_MIN_S)  # far, but within the time floor
    assert pool.version == 2 and pool.mean_prefill_s == moved
    pool.observe(pool.predictor.mean_prefill_s, 0, now=21.0 + TTFT_REPUBLISH_MIN_S)  # floor passed
    assert pool.version == 3 and pool.mean_prefill_s > 1.0


def test_free_kv_bytes() -> None:
    assert free_kv_bytes(1000, 0.25, 100) == 75_000
    assert free_kv_bytes(1000, -1.0, 100) == 100_000
    assert free_kv_bytes(1000, math.nan, 100) == 0  # NaN counts as full
    assert free_kv_bytes(0, 0.0, 100) == free_kv_bytes(1000, 0.0, 0) == 0
