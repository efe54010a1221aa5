"""What the Redis backend shares besides limits: the response cache, the KV working set, and the
tokens-per-minute limit checked across replicas.

Three replicas (each its own gateway) in front of the same fake instances, on the machine's real
Redis under a fresh key prefix; the fail-open test runs a ``redis-server`` of its own and kills it.
Checked as a user would: ``x-tokenplane-cache`` and what the instances received, 429
``kv_working_set`` answers and ``/metrics``, the tokens of the answers that came back.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenplane.gateway import hash_key

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from redis_server import SHARED_URL, PrivateRedis

pytestmark = pytest.mark.anyio

KEY = "sk-test-acme"
PROMPT = "x" * 2400  # 600 tokens by the gateway's estimate: with max_tokens 50, one task is ~650


@pytest.fixture
async def replicas(gateway: Any, names: Any) -> AsyncIterator[Callable[..., Awaitable[list[Any]]]]:
    async def make(
        n: int, ups: list[Any], *, url: str, prefix: str, model: dict[str, Any], **sections: Any
    ) -> list[Any]:
        state = {"backend": "redis", "url": url, "key_prefix": prefix, "sync_interval_s": 0.05}
        state.update(sections.pop("state", {}))
        models = [{"name": names.MODEL, "upstream_model": names.UPSTREAM_MODEL, **model}]
        instances = [
            {"id": u.name, "url": u.url, "model": names.MODEL, "kind": "vllm", "kv_capacity_tokens": 1000}
            for u in ups
        ]
        return [
            await gateway(ups, state=state, models=models, instances=instances, **sections) for _ in range(n)
        ]

    yield make


def tenants(**limits: Any) -> list[dict[str, Any]]:
    return [{"name": "acme", "priority": "interactive", "api_keys": [hash_key(KEY)], **limits}]


async def metric(gw: Any, name: str, **labels: str) -> float:
    text = await gw.get("/metrics")
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


async def until(predicate: Callable[[], Awaitable[bool]], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def ask(gw: Any, model: str, content: str, **extra: Any) -> tuple[int, Any, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "temperature": 0, **extra}
    return await gw.post("/v1/chat/completions", body, key=KEY)


# -- the response cache ---------------------------------------------------------------------------
async def test_an_answer_cached_through_one_replica_is_a_hit_through_the_others(
    upstreams: Any, replicas: Any, key_prefix: str, names: Any
) -> None:
    ups = await upstreams(2)
    gws = await replicas(
        3, ups, url=SHARED_URL, prefix=key_prefix, model={"response_cache": {"ttl_s": 30}}, tenants=tenants()
    )
    status, first, headers = await ask(gws[0], names.MODEL, "two plus two?")
    assert status == 200 and headers.get("x-tokenplane-cache") != "hit"
    served = sum(len(u.requests) for u in ups)
    assert served == 1

    async def stored() -> bool:  # the store is off the request path: wait for it to land
        return await metric(gws[0], "tokenplane_response_cache_total", result="store") == 1

    await until(stored)
    await asyncio.sleep(0.05)
    for gw in gws[1:]:
        status, again, headers = await ask(gw, names.MODEL, "two plus two?")
        assert status == 200 and headers.get("x-tokenplane-cache") == "hit"
        assert again == first  # the same answer, byte for byte (its id included)
        assert await metric(gw, "tokenplane_response_cache_total", result="shared_hit") == 1
        assert await metric(gw, "tokenplane_response_cache_total", result="miss") == 0
    # the second ask on a replica is answered from its own (first-level) cache
    status, _, headers = await ask(gws[2], names.MODEL, "two plus two?")
    assert headers.get("x-tokenplane-cache") == "hit"
    assert await metric(gws[2], "tokenplane_response_cache_total", result="hit") == 1
    # a streaming request through a third replica replays the shared answer as SSE
    client = gws[1].client(KEY)
    stream = await client.chat.completions.create(
        model=names.MODEL, messages=[{"role": "user", "content": "two plus two?"}], temperature=0, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == first["choices"][0]["message"]["content"]
    # another tenant's key, or another question, is not a hit: it reaches an instance
    status, _, headers = await ask(gws[1], names.MODEL, "three plus three?")
    assert status == 200 and headers.get("x-tokenplane-cache") != "hit"
    assert sum(len(u.requests) for u in ups) == served + 1


async def test_answers_over_the_shared_size_bound_stay_local(
    upstreams: Any, replicas: Any, key_prefix: str, names: Any
) -> None:
    ups = await upstreams(1)
    model = {"response_cache": {}}
    gws = await replicas(
        2,
        ups,
        url=SHARED_URL,
        prefix=key_prefix,
        model=model,
        tenants=tenants(),
        state={"cache_max_entry_bytes": 64},
    )
    assert (await ask(gws[0], names.MODEL, "big"))[0] == 200
    await asyncio.sleep(0.2)
    status, _, headers = await ask(gws[0], names.MODEL, "big")
    assert headers.get("x-tokenplane-cache") == "hit"  # kept locally
    status, _, headers = await ask(gws[1], names.MODEL, "big")
    assert status == 200 and headers.get("x-tokenplane-cache") != "hit"  # over the bound: not shared
    assert len(ups[0].requests) == 2


async def test_the_cache_fails_open_when_redis_stops(
    upstreams: Any, replicas: Any, private_redis: PrivateRedis, names: Any
) -> None:
    ups = await upstreams(1)
    gws = await replicas(
        2, ups, url=private_redis.url, prefix="tp:", model={"response_cache": {}}, tenants=tenants()
    )
    assert (await ask(gws[0], names.MODEL, "before"))[0] == 200
    await asyncio.sleep(0.2)
    private_redis.kill()
    status, _, headers = await ask(gws[0], names.MODEL, "before")
    assert status == 200 and headers.get("x-tokenplane-cache") == "hit"  # the local cache still answers
    for gw in gws:  # a miss goes to an instance (the Redis lookup fails open)
        status, _, headers = await ask(gw, names.MODEL, "during")
        assert status == 200
    assert await metric(gws[1], "tokenplane_state_backend_up") == 0
    assert await metric(gws[1], "tokenplane_state_fail_open_total", operation="cache_get") >= 1


# -- the KV working set ---------------------------------------------------------------------------
def _wf(workflow_id: str, step: int, total: int = 3) -> dict[str, str]:
    return {
        "x-tokenplane-workflow-id": workflow_id,
        "x-tokenplane-step": str(step),
        "x-tokenplane-total-steps": str(total),
    }


async def _step(gw: Any, names: Any, workflow_id: str, step: int) -> tuple[int, Any]:
    body = {"model": names.MODEL, "prompt": PROMPT, "max_tokens": 50}
    headers = {"Authorization": f"Bearer {KEY}", **_wf(workflow_id, step)}
    async with gw.http.post(gw.url + "/v1/completions", json=body, headers=headers) as r:
        return r.status, await r.json(content_type=None)


async def test_the_working_set_limit_is_the_fleets_not_each_replicas(
    upstreams: Any, replicas: Any, key_prefix: str, names: Any
) -> None:
    """Budget 0.5 x (2 x 1000) = 1000 KV tokens, one task ~650: one task at a time, fleet-wide."""
    ups = await upstreams(2)
    gws = await replicas(
        3, ups, url=SHARED_URL, prefix=key_prefix, model={"kv_working_set_fraction": 0.5}, tenants=tenants()
    )

    async def tasks_seen_by_all(n: int) -> bool:
        return all([await metric(gw, "tokenplane_working_set_tasks") == n for gw in gws])

    assert (await _step(gws[0], names, "a", 1))[0] == 200
    await until(lambda: tasks_seen_by_all(1))
    assert 600 < await metric(gws[2], "tokenplane_working_set_tokens") <= 1000
    status, body = await _step(gws[1], names, "b", 1)  # a new task through another replica waits
    assert status == 429 and body["error"]["code"] == "kv_working_set"
    assert (await _step(gws[2], names, "a", 2))[0] == 200  # a started task's step goes anywhere
    assert (await _step(gws[1], names, "a", 3))[0] == 200  # its last step: it leaves, everywhere
    await until(lambda: tasks_seen_by_all(0))
    assert (await _step(gws[2], names, "b", 1))[0] == 200
    await until(lambda: tasks_seen_by_all(1))
    assert (await _step(gws[0], names, "c", 1))[0] == 429
    rejected = [await metric(gw, "tokenplane_rejected_total", reason="kv_working_set") for gw in gws]
    assert rejected == [1, 1, 0]


# -- tokens per minute ----------------------------------------------------------------------------
async def test_tokens_per_minute_hold_across_three_replicas(
    upstreams: Any, replicas: Any, key_prefix: str, names: Any
) -> None:
    """A fresh minute's worth of load, 6 callers on each of 3 replicas: what the fleet serves is the
    tenant's ``tpm_limit`` within 5 %, not three times it. Each request costs what the gateway
    counts: its prompt estimate (400 characters: 100 tokens) plus the completion tokens the answer
    reports. A sliding minute across bucket rollover is not checked here (a minutes-long run)."""
    ups = await upstreams(2)
    for u in ups:
        u.tokens = 2  # completions are charged when they end: at most 20 x 2 tokens late
        u.answer_delay_s = 0.01
    limit = 2000
    gws = await replicas(
        3, ups, url=SHARED_URL, prefix=key_prefix, model={}, tenants=tenants(tpm_limit=limit)
    )
    served: list[int] = []
    refused = 0

    async def caller(i: int) -> None:
        nonlocal refused
        for j in range(5):
            body = {"model": names.MODEL, "prompt": f"{i:03d}{j:03d}" + "y" * 394, "max_tokens": 2}
            status, answer, headers = await gws[i % 3].post("/v1/completions", body, key=KEY)
            if status == 200:
                served.append(100 + answer["usage"]["completion_tokens"])
            else:
                assert status == 429 and answer["error"]["code"] == "rate_limit_exceeded"
                assert int(headers["Retry-After"]) >= 1
                refused += 1

    await asyncio.gather(*(caller(i) for i in range(18)))
    total = sum(served)
    print(f"\nserved {len(served)} requests, {total} tokens (limit {limit}); refused {refused}")
    assert 0.9 * limit <= total <= 1.05 * limit
    assert refused == 90 - len(served)


async def test_tokens_per_window_hold_over_every_sliding_window_across_rollovers(
    upstreams: Any, replicas: Any, key_prefix: str, names: Any
) -> None:
    """The same limit over a sliding window, not a fresh one: a 2 s window (``rate_window_s``, so
    that the run crosses 30 slot rollovers and two whole windows in 5 s), 18 callers resending at
    once through 3 replicas from a random point in a window on. In every span of one window (the
    requests sent and answered inside it) the tokens served stay within 5 % of ``tpm_limit``, and the
    fleet is not starved either (at least 75 % of the limit per window over the run: the callers
    must keep up, which a loaded machine can slow)."""
    ups = await upstreams(2)
    for u in ups:
        u.tokens = 2
        u.answer_delay_s = 0.005
    limit, window, run_s = 2000, 2.0, 5.0
    gws = await replicas(
        3,
        ups,
        url=SHARED_URL,
        prefix=key_prefix,
        model={},
        tenants=tenants(tpm_limit=limit),
        # a slow answer from Redis on a loaded machine must not send a replica to its local
        # limits (fail open, each replica the whole limit): this test is about the shared ones
        state={"rate_window_s": window, "timeout_s": 5.0},
    )
    loop = asyncio.get_running_loop()
    served: list[tuple[float, float, int]] = []  # sent, answered (from start), tokens
    refused = 0
    start = loop.time()

    async def caller(i: int) -> None:
        nonlocal refused
        j = 0
        while loop.time() - start < run_s:
            j += 1
            body = {"model": names.MODEL, "prompt": f"{i:03d}{j:04d}" + "y" * 393, "max_tokens": 2}
            sent = loop.time()
            status, answer, _ = await gws[i % 3].post("/v1/completions", body, key=KEY)
            if status == 200:
                served.append((sent - start, loop.time() - start, 100 + answer["usage"]["completion_tokens"]))
            else:
                assert status == 429 and answer["error"]["code"] == "rate_limit_exceeded"
                refused += 1
                await asyncio.sleep(0.01)

    await asyncio.gather(*(caller(i) for i in range(18)))
    # Each request was admitted somewhere between its sending and its answer: count in a window only
    # those whose whole span lies in it (on a loaded machine the event loop lags, and a window of
    # send times alone would hold requests admitted more than a window apart)
    worst = max(sum(n for a, b, n in served if s <= a and b < s + window) for s, _, _ in served)
    total = sum(n for _, _, n in served)
    per_window = total / (run_s / window)
    print(f"\nserved {len(served)} ({total} tokens, {per_window:.0f} per window), refused {refused}; "
          f"most in one sliding {window} s window: {worst} ({worst / limit:.3f}x the limit)")  # fmt: skip
    fell_back = [await metric(gw, "tokenplane_state_fail_open_total", operation="acquire") for gw in gws]
    assert fell_back == [0.0, 0.0, 0.0]  # every request was decided by Redis
    assert worst <= 1.05 * limit
    assert per_window >= 0.75 * limit  # not starved (loose: a loaded machine slows the callers)
