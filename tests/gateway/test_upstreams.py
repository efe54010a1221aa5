"""Scraped runtime metrics, health checks, and the in-flight accounting the router reads."""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from typing import Any

import pytest

from tokenplane.core.prompt_hash import approx_tokens, render_chat
from tokenplane.gateway.config import HealthConfig, InstanceConfig, ScrapeConfig
from tokenplane.gateway.runtimes import RuntimeMetrics, runtime_for
from tokenplane.gateway.upstreams import Upstream, UpstreamPool

VLLM_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 640.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0"} 5.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf"} 6.0
"""

CACHE_INFO = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",enable_prefix_caching="True",num_gpu_blocks="2048"} 1.0
"""

LLAMACPP_PAGE = """\
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 4
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 99
"""


@pytest.mark.parametrize(
    ("kind", "page", "expected"),
    [
        ("vllm", VLLM_PAGE, RuntimeMetrics(5, 7, 0.42, 1000, 640)),
        ("emulated", VLLM_PAGE, RuntimeMetrics(5, 7, 0.42, 1000, 640)),
        ("llamacpp", LLAMACPP_PAGE, RuntimeMetrics(running=1, waiting=4)),
        ("openai", VLLM_PAGE, RuntimeMetrics()),
        ("vllm", "", RuntimeMetrics()),
        ("vllm", VLLM_PAGE + CACHE_INFO, RuntimeMetrics(5, 7, 0.42, 1000, 640, kv_capacity_tokens=16 * 2048)),
        ("vllm", VLLM_PAGE + CACHE_INFO.replace('"2048"', '"None"'), RuntimeMetrics(5, 7, 0.42, 1000, 640)),
        ("llamacpp", LLAMACPP_PAGE + CACHE_INFO, RuntimeMetrics(running=1, waiting=4)),
    ],
)
def test_parse_runtime_metrics(kind, page, expected) -> None:
    assert runtime_for(kind).parse_metrics(page) == expected


@pytest.mark.anyio
async def test_scraped_metrics_reach_instances_and_metrics(upstreams, gateway, wait) -> None:
    ups = await upstreams(2)
    ups[0].metrics.running, ups[0].metrics.waiting, ups[0].metrics.kv_usage = 3, 5, 0.75
    ups[0].metrics.prefix_queries, ups[0].metrics.prefix_hits = 200, 150
    gw = await gateway(ups)

    async def scraped() -> bool:
        return (await gw.instances())["up-0"]["waiting"] == 5

    await wait(scraped)
    view = (await gw.instances())["up-0"]
    assert view["running"] == 3 and view["kv_usage"] == 0.75
    assert view["prefix_cache_hits"] == 150 and view["prefix_cache_queries"] == 200
    assert view["gpu"] == "H100" and view["price_per_hour"] == 2.5 and view["healthy"] is True
    text = await gw.get("/metrics", key=None)
    assert 'tokenplane_instance_waiting{instance="up-0",model="llama-3-8b"} 5.0' in text
    assert 'tokenplane_instance_kv_usage{instance="up-0",model="llama-3-8b"} 0.75' in text
    assert 'tokenplane_instance_running{instance="up-1",model="llama-3-8b"} 0.0' in text
    # A change on the instance shows up on the next scrape.
    ups[0].metrics.waiting = 1

    async def rescraped() -> bool:
        return (await gw.instances())["up-0"]["waiting"] == 1

    await wait(rescraped)


@pytest.mark.anyio
async def test_a_slow_scrape_still_lands(upstreams, gateway, wait) -> None:
    """A runtime busy with a burst answers /metrics late. With a 50 ms interval the scrape used to
    give up after 0.5 s, so the view never moved; now the scrape timeout is its own setting."""
    ups = await upstreams(1)
    ups[0].metrics_delay_s = 0.8
    ups[0].metrics.waiting = 6
    gw = await gateway(ups, scrape={"timeout_s": 3.0})

    async def scraped() -> bool:
        return (await gw.instances())["up-0"]["waiting"] == 6

    await wait(scraped)


@pytest.mark.anyio
async def test_a_scrape_that_times_out_is_counted_and_its_view_shows_its_age(
    upstreams, gateway, wait, caplog
) -> None:
    """A view that stopped moving must not read as an idle instance: failed scrapes are counted by
    reason, the last landed scrape's time is exported, and a streak of misses is logged once."""
    caplog.set_level(logging.INFO, logger="tokenplane.gateway.upstreams")
    ups = await upstreams(2)
    ups[0].metrics_delay_s = 0.6
    ups[0].metrics.waiting = 4
    ups[1].metrics.waiting = 2
    gw = await gateway(ups, scrape={"interval_s": 0.05, "timeout_s": 0.1})

    async def failing() -> bool:
        return (await gw.instances())["up-0"]["scrape_failures"].get("timeout", 0) >= 3

    await wait(failing)
    view = (await gw.instances())["up-0"]
    assert view["scraped_at"] is None and view["waiting"] == 0  # never landed: the view is the default
    assert (await gw.instances())["up-1"]["scrape_failures"] == {}
    text = await gw.get("/metrics", key=None)
    failures = re.search(
        r'tokenplane_instance_scrape_failures_total\{instance="up-0",[^}]*reason="timeout"\} (\S+)', text
    )
    assert failures is not None and float(failures.group(1)) >= 3, text
    assert 'tokenplane_instance_scrape_timestamp_seconds{instance="up-0"' not in text
    landed = re.search(r'tokenplane_instance_scrape_timestamp_seconds\{instance="up-1",[^}]*\} (\S+)', text)
    assert landed is not None and abs(float(landed.group(1)) - time.time()) < 5.0
    warned = [r for r in caplog.records if "scrapes of up-0 keep failing" in r.getMessage()]
    assert len(warned) == 1 and "scrape.timeout_s" in warned[0].getMessage()

    ups[0].metrics_delay_s = 0.0  # the runtime answers in time again: the view moves

    async def landed_again() -> bool:
        return (await gw.instances())["up-0"]["waiting"] == 4

    await wait(landed_again)
    assert any("scrapes of up-0 land again" in r.getMessage() for r in caplog.records)


@pytest.mark.anyio
async def test_a_hung_instance_does_not_hold_back_the_others_views(upstreams, gateway, wait) -> None:
    """Scrapes and health checks of one instance that takes seconds to answer run in the background;
    the others' rounds go on at the interval (they used to wait for the slowest every round)."""
    ups = await upstreams(2)
    ups[0].metrics_delay_s = ups[0].health_delay_s = 3.0
    gw = await gateway(ups, scrape={"timeout_s": 5.0}, health={"timeout_s": 5.0})
    await asyncio.sleep(0.3)  # the first rounds are under way, up-0's checks among them
    ups[1].metrics.waiting = 7

    async def scraped() -> bool:
        return (await gw.instances())["up-1"]["waiting"] == 7

    await wait(scraped, timeout_s=1.5)
    assert (await gw.instances())["up-0"]["healthy"] is True  # slow is not down: its checks still run


@pytest.mark.anyio
async def test_health_check_takes_instance_out_and_back(upstreams, gateway, wait, names) -> None:
    ups = await upstreams(2)
    gw = await gateway(ups)

    async def healthy(iid: str, want: bool) -> bool:
        return (await gw.instances())[iid]["healthy"] is want

    ups[1].healthy = False
    await wait(lambda: healthy("up-1", False))
    for i in range(6):
        await gw.client().completions.create(model=names.MODEL, prompt=f"{i} unrelated " * 30)
    assert len(ups[1].requests) == 0 and len(ups[0].requests) == 6
    assert (await gw.get("/health", key=None))["healthy_instances"] == 1
    assert 'tokenplane_instance_healthy{instance="up-1",model="llama-3-8b"} 0.0' in await gw.get(
        "/metrics", key=None
    )
    ups[1].healthy = True
    await wait(lambda: healthy("up-1", True))


@pytest.mark.anyio
async def test_slow_health_checks_while_answering_are_busy_not_down(upstreams, gateway, names) -> None:
    """Health checks that time out while the instance streams answers do not take it out; the same
    silence from an idle instance does."""
    ups = await upstreams(1)
    ups[0].tokens, ups[0].token_delay_s = 40, 0.03  # a 1.2 s stream
    gw = await gateway(ups, health={"interval_s": 0.05, "timeout_s": 0.1, "failures_to_down": 2})
    stream = await gw.client().completions.create(model=names.MODEL, prompt="x", stream=True)
    pieces, views = [], []
    async for chunk in stream:
        pieces.append(chunk.choices[0].text)
        if len(pieces) == 1:
            # Slow from the first token on: set before it, a check timing out while the request was
            # still on its way (a loaded machine takes > 0.1 s to send it) counted, rightly.
            ups[0].health_delay_s = 0.5
        if len(pieces) % 8 == 0:
            views.append((await gw.instances())["up-0"])
    assert len(pieces) == 40 and len(views) == 5
    assert all(v["healthy"] and v["consecutive_failures"] == 0 for v in views), views

    deadline = asyncio.get_running_loop().time() + 3
    while (await gw.instances())["up-0"]["healthy"]:  # idle now: the timeouts count
        assert asyncio.get_running_loop().time() < deadline, "an idle, silent instance stayed in"
        await asyncio.sleep(0.05)
    assert "timed out" in (await gw.instances())["up-0"]["last_error"]


@pytest.mark.anyio
async def test_timeouts_while_the_instance_answers_others_do_not_take_it_out(
    upstreams, gateway, names
) -> None:
    """A plain request that outlives the upstream timeout on an instance still streaming to others
    is a long generation on a busy instance: 504 for that request, the instance stays in. With
    nothing else flowing, the same timeouts take it out."""
    ups = await upstreams(1)
    ups[0].tokens, ups[0].token_delay_s, ups[0].plain_delay_s = 40, 0.03, 5.0
    gw = await gateway(
        ups, health={"interval_s": 60}, retry={"max_attempts": 1}, limits={"upstream_timeout_s": 0.3}
    )

    async def streamed() -> int:
        stream = await gw.client().completions.create(model=names.MODEL, prompt="x", stream=True)
        return len([c async for c in stream])

    async def plain() -> int:
        return (await gw.post("/v1/completions", {"model": names.MODEL, "prompt": "y"}))[0]

    task = asyncio.create_task(streamed())
    statuses = [await plain() for _ in range(3)]
    assert statuses == [504, 504, 504]
    view = (await gw.instances())["up-0"]
    assert view["healthy"] and view["consecutive_failures"] == 0, view
    assert await task == 40

    statuses = [await plain() for _ in range(2)]  # idle now: the same timeouts count
    assert statuses == [504, 504]
    assert not (await gw.instances())["up-0"]["healthy"]


@pytest.mark.anyio
async def test_failed_requests_take_instance_out(upstreams, gateway, names) -> None:
    ups = await upstreams(2)
    # No retries: each failure reaches the client (retries are tested in test_resilience_*.py).
    gw = await gateway(ups, router="round-robin", health={"interval_s": 60}, retry={"max_attempts": 1})
    ups[0].mode = "fail"
    statuses = [
        (await gw.post("/v1/completions", {"model": names.MODEL, "prompt": "x"}))[0] for _ in range(8)
    ]
    # Two failures take up-0 out; every later request goes to up-1.
    assert statuses.count(502) == 2
    assert not (await gw.instances())["up-0"]["healthy"]


@pytest.mark.anyio
async def test_in_flight_accounting(upstreams, gateway, names, wait) -> None:
    ups = await upstreams(1)
    ups[0].tokens, ups[0].token_delay_s = 20, 0.02
    gw = await gateway(ups)
    task = asyncio.create_task(
        gw.post(
            "/v1/chat/completions",
            {
                "model": names.MODEL,
                "messages": [{"role": "user", "content": "x" * 400}],
                "max_tokens": 100,
                "stream": True,
            },
        )
    )

    async def busy() -> bool:
        return (await gw.instances())["up-0"]["outstanding_requests"] == 1

    await wait(busy)
    view = (await gw.instances())["up-0"]
    prompt = approx_tokens(render_chat([{"role": "user", "content": "x" * 400}]))
    assert view["outstanding_tokens"] == prompt + 100  # the rendered prompt's estimate + max_tokens
    assert (await task)[0] == 200
    view = (await gw.instances())["up-0"]
    assert view["outstanding_requests"] == 0 and view["outstanding_tokens"] == 0


async def test_kv_capacity_scraped_from_the_emulator(emulators, emu_gateway, wait) -> None:
    """An instance without ``kv_capacity_tokens`` in config reports its cache size through vLLM's
    ``vllm:cache_config_info``; the gateway's view of it carries that size."""
    emus = await emulators(2, kv_capacity_tokens=4096)
    gw = await emu_gateway(emus, instance={"kv_capacity_tokens": 0})

    async def scraped() -> bool:
        inst = await gw.instances()
        return all(i["kv_capacity_tokens"] == 4096 for i in inst.values())

    await wait(scraped)


# -- the seven-axis fields of the view ------------------------------------------------------------


def _upstream(**config: Any) -> tuple[Upstream, UpstreamPool]:
    cfg = InstanceConfig(id="i", url="http://127.0.0.1:1", **{"model": "m", **config})
    pool = UpstreamPool([cfg], ScrapeConfig(), HealthConfig(failures_to_down=2))
    u = pool.get("i")
    assert u is not None
    return u, pool


def test_weights_follow_health_and_requests() -> None:
    u, _ = _upstream()
    assert u.view().weights == "cold"  # not yet seen serving
    u.record_probe_success()
    assert u.view().weights == "warm"
    u.record_failure("x")
    assert u.view().weights == "warm"  # one failure of two: still in
    u.record_failure("x")
    assert u.view().weights == "cold" and not u.view().healthy
    u.set_weights("warming")  # the autoscaler's lifecycle: starting
    assert u.view().weights == "warming"
    u.record_success()
    assert u.view().weights == "warm"
    with pytest.raises(ValueError, match="warm, warming or cold"):
        u.set_weights("hot")


def test_hbm_free_bytes_is_the_free_kv_cache_in_bytes() -> None:
    u, _ = _upstream(kv_bytes_per_token=100)
    assert u.view().hbm_free_bytes == 0  # capacity unknown
    u.apply_metrics(RuntimeMetrics(kv_usage=0.25, kv_capacity_tokens=1000), 0.0)
    assert u.view().hbm_free_bytes == 75_000 and u.view().kv_capacity_tokens == 1000
    u.apply_metrics(RuntimeMetrics(kv_usage=float("nan"), kv_capacity_tokens=1000), 0.0)
    assert u.view().hbm_free_bytes == 0  # NaN usage counts as full
    known, _ = _upstream(model="llama-3-8b", kv_capacity_tokens=1000)  # the twin's catalogue
    assert known.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert known.view().hbm_free_bytes == 1000 * known.kv_bytes_per_token
    unknown, _ = _upstream(model="no-such-model", kv_capacity_tokens=1000)
    assert unknown.view().hbm_free_bytes == 0


def test_predicted_ttft_comes_from_the_pools_observed_ttfts() -> None:
    u, pool = _upstream()
    other = pool.add(InstanceConfig(id="j", url="http://127.0.0.1:2", model="m"), weights="warming")
    assert other.view().weights == "warming"  # the autoscaler's lifecycle
    u.record_probe_success()
    other.record_probe_success()
    u.apply_metrics(RuntimeMetrics(waiting=3), 0.0)
    assert u.view().predicted_ttft_s == 0.0  # nothing observed yet: the router's own model decides
    pool.ttft("m").predictor.alpha = 1.0
    other.observe_ttft(0.5, waiting_ahead=4, now=0.0)  # 0.1 s per request ahead, learnt on the other instance
    assert math.isclose(u.view().predicted_ttft_s, (3 + 1) * 0.1)
    assert math.isclose(other.view().predicted_ttft_s, 0.1)
    u.observe_ttft(0.1001, waiting_ahead=0, now=5.0)  # a move under TTFT_REPUBLISH_RATIO keeps the views
    assert math.isclose(u.view().predicted_ttft_s, 0.4)
    u.set_weights("warming")
    assert u.view().predicted_ttft_s == 0.0  # not warm: the router adds its own readiness delay
