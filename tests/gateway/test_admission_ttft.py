"""SLO-predictive shedding in the gateway's pool admission: the core's TTFT predictor over the
pool's instance views, and the core shedder's ``TTFT_OVER_BUDGET``."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tokenplane.core.admission import AdmissionQueue, PriorityClass
from tokenplane.core.shedding import LoadShedder, TtftPredictor
from tokenplane.core.ttft import PoolTtft
from tokenplane.core.views import InstanceView, RequestInfo
from tokenplane.gateway.admission import AdmissionMetrics, PoolAdmission
from tokenplane.gateway.errors import PoolSaturated

pytestmark = pytest.mark.anyio


def _pool(
    views: Sequence[InstanceView] | None, capacity: int = 8, predictor: TtftPredictor | None = None
) -> tuple[PoolAdmission, CollectorRegistry]:
    registry = CollectorRegistry()
    pools: dict[str, PoolAdmission] = {}
    pool = PoolAdmission(
        "m",
        AdmissionQueue.from_params({}, pool="m"),
        LoadShedder.from_params({}),
        lambda: capacity,
        AdmissionMetrics(registry, lambda: pools),
        views=None if views is None else (lambda: views),
        ttft=_observed(predictor if predictor is not None else TtftPredictor(mean_prefill_s=0.2)),
    )
    pools["m"] = pool
    return pool, registry


def _observed(predictor: TtftPredictor) -> PoolTtft:
    """A pool TTFT that has observed one first token at exactly the predictor's mean (so it
    predicts, and the mean stays where the test set it)."""
    ttft = PoolTtft(predictor)
    ttft.observe(predictor.mean_prefill_s, 0, now=0.0)
    return ttft


def _info(budget_s: float | None, now: float, prompt_tokens: int = 1000) -> RequestInfo:
    return RequestInfo("r1", "m", prompt_tokens, 16, arrival_s=now, latency_budget_s=budget_s)


BUSY = [InstanceView("a", waiting=10), InstanceView("b", waiting=12)]


@pytest.mark.parametrize(
    ("budget_s", "views", "shed"),
    [
        # min over instances: 10 waiting x 0.2 s + 1000 tokens / 10k tokens/s = 2.1 s
        (1.0, BUSY, True),
        (2.0, BUSY, True),
        (3.0, BUSY, False),
        (None, BUSY, False),  # the class's budget (standard: 120 s)
        (1.0, [InstanceView("a", waiting=0)], False),  # 0.1 s
        (1.0, [InstanceView("a", waiting=10, healthy=False)], False),  # no usable instance: routing's call
        (1.0, None, False),  # no views given: today's admission
    ],
)
async def test_a_request_whose_predicted_ttft_exceeds_its_budget_is_shed(
    budget_s: float | None, views: list[InstanceView] | None, shed: bool
) -> None:
    pool, registry = _pool(views)
    now = time.monotonic()
    if not shed:
        deadline = await pool.admit(_info(budget_s, now), PriorityClass.STANDARD, now)
        assert deadline > now and pool.in_flight == 1
        return
    with pytest.raises(PoolSaturated) as err:
        await pool.admit(_info(budget_s, now), PriorityClass.STANDARD, now)
    assert err.value.status == 503 and err.value.code == "shed"
    assert "predicted time to first token" in err.value.message and "2.10 s" in err.value.message
    assert f"latency budget of {budget_s:.3g} s" in err.value.message
    assert registry.get_sample_value("tokenplane_shed_total", {"reason": "ttft_over_budget"}) == 1.0
    assert pool.in_flight == 0 and pool.queue.depth == 0


async def test_the_class_budget_is_the_deadline_without_a_request_budget() -> None:
    registry = CollectorRegistry()
    pool = PoolAdmission(
        "m",
        AdmissionQueue.from_params({"budget_s": {"interactive": 1.5}}, pool="m"),
        LoadShedder.from_params({}),
        lambda: 8,
        AdmissionMetrics(registry, dict),
        views=lambda: BUSY,
        ttft=_observed(TtftPredictor(mean_prefill_s=0.2)),
    )
    now = time.monotonic()
    with pytest.raises(PoolSaturated, match=r"2\.10 s, over the request's latency budget of 1\.5 s"):
        await pool.admit(_info(None, now), PriorityClass.INTERACTIVE, now)
    assert await pool.admit(_info(None, now), PriorityClass.STANDARD, now) > now


async def test_observed_ttfts_move_the_prediction() -> None:
    predictor = TtftPredictor(mean_prefill_s=0.05, alpha=1.0)
    pool, _ = _pool(BUSY, predictor=predictor)
    now = time.monotonic()
    await pool.admit(_info(1.0, now), PriorityClass.STANDARD, now)  # 10 x 0.05 + 0.1 = 0.6 s
    predictor.observe(2.2, waiting_ahead=10)  # 0.2 s per request ahead
    with pytest.raises(PoolSaturated, match=r"2\.10 s"):
        await pool.admit(_info(1.0, now), PriorityClass.STANDARD, now)


async def test_the_queued_path_load_signal_carries_the_prediction() -> None:
    """No free capacity: the request would queue, and the shedder's signal carries the prediction."""
    pool, registry = _pool(BUSY, capacity=0)
    now = time.monotonic()
    info = RequestInfo("r1", "m", 1000, 16, arrival_s=now)  # the class budget (30 s) is its deadline
    signal = pool.load_signal(info, 0, now)
    assert math.isclose(signal.predicted_ttft_s, 2.1)
    pool_inf, _ = _pool([InstanceView("a", healthy=False)], capacity=0)
    assert pool_inf.load_signal(info, 0, now).predicted_ttft_s == math.inf
    no_model, _ = _pool(None, capacity=0)
    assert no_model.load_signal(info, 0, now).predicted_ttft_s == 0.0
    assert registry.get_sample_value("tokenplane_shed_total", {"reason": "ttft_over_budget"}) is None


async def test_the_gateway_sheds_a_request_whose_predicted_ttft_is_over_its_budget(
    upstreams: Any, gateway: Any
) -> None:
    """Through the gateway: the interactive class's TTFT budget is 0.2 s; a prompt of ~5,000 tokens
    is predicted at ~0.5 s of prefill alone (the core's default 10k tokens/s), so once the pool has
    observed a TTFT it is shed before any instance spends work on it, with a 503 naming the
    prediction; before that first observation nothing is predicted and it goes through."""
    ups = await upstreams(1)
    gw = await gateway(ups, admission={"queue": {"budget_s": {"interactive": 0.2}}})
    short = {"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    long = {**short, "messages": [{"role": "user", "content": "word " * 4000}]}
    status, body, _ = await gw.post("/v1/chat/completions", long)
    assert status == 200, body  # nothing predicted before the pool's first observed TTFT
    status, body, _ = await gw.post("/v1/chat/completions", {**short, "stream": True})
    assert status == 200 and b"[DONE]" in body, body  # a stream's first token: a TTFT observed
    status, err, _ = await gw.post("/v1/chat/completions", long)
    assert status == 503, err
    assert err["error"]["code"] == "shed"
    message = err["error"]["message"]
    assert "ttft_over_budget" in message and "predicted time to first token" in message, message
    assert "over the request's latency budget of 0.2 s" in message, message
    assert len(ups[0].requests) == 2  # the shed request never reached the instance
    metrics = await gw.get("/metrics")
    assert 'tokenplane_shed_total{reason="ttft_over_budget"} 1.0' in metrics
