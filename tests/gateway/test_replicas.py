"""Several gateway replicas on one shared Redis (``state: {backend: redis}``).

Three replicas (each its own gateway: state, pipeline, server) in front of the same fake instances,
on the machine's real Redis under a fresh key prefix; the Redis-down test runs a ``redis-server``
of its own and kills it. What is checked is what an operator would check: requests in flight
counted at the instances, 429s with ``Retry-After`` through the official client, breaker states in
``/v1/instances``, which instance served each turn of a conversation, ``/metrics``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenplane.gateway import hash_key

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from redis_server import SHARED_URL, PrivateRedis

pytestmark = pytest.mark.anyio

KEY = "sk-test-acme"


def tenants(**limits: Any) -> list[dict[str, Any]]:
    return [{"name": "acme", "priority": "interactive", "api_keys": [hash_key(KEY)], **limits}]


def count_in_flight(upstream: Any) -> dict[str, int]:
    """Wrap a fake instance's handler to count the requests it holds at once (``peak``)."""
    counts = {"now": 0, "peak": 0}
    answer = upstream._answer

    async def counted(request: Any, *, chat: bool) -> Any:
        counts["now"] += 1
        counts["peak"] = max(counts["peak"], counts["now"])
        try:
            return await answer(request, chat=chat)
        finally:
            counts["now"] -= 1

    upstream._answer = counted
    return counts


@pytest.fixture
async def replicas(gateway: Any) -> AsyncIterator[Callable[..., Awaitable[list[Any]]]]:
    async def make(n: int, ups: list[Any], *, url: str, prefix: str, **sections: Any) -> list[Any]:
        state = {"backend": "redis", "url": url, "key_prefix": prefix, **sections.pop("state", {})}
        return [await gateway(ups, state=state, **sections) for _ in range(n)]

    yield make


async def chat(gw: Any, content: str, **extra: Any) -> tuple[int, Any, Any]:
    body = {"model": "llama-3-8b", "messages": [{"role": "user", "content": content}], **extra}
    return await gw.post("/v1/chat/completions", body, key=KEY)


async def refusals(gw: Any, reason: str) -> float:
    families = text_string_to_metric_families(await gw.get("/metrics"))
    return sum(
        sample.value
        for family in families
        for sample in family.samples
        if sample.name == "tokenplane_quota_refusals_total" and sample.labels.get("reason") == reason
    )


async def test_a_tenants_concurrency_limit_holds_across_three_replicas(
    upstreams: Any, replicas: Any, key_prefix: str
) -> None:
    ups = await upstreams(2)
    counts = [count_in_flight(u) for u in ups]
    for u in ups:
        u.answer_delay_s = 0.3
    gws = await replicas(
        3, ups, url=SHARED_URL, prefix=key_prefix, router="round-robin", tenants=tenants(max_concurrency=4)
    )
    results = await asyncio.gather(*(chat(gws[i % 3], f"q{i}") for i in range(24)))
    statuses = [s for s, _, _ in results]
    peak = max(c["peak"] for c in counts)
    total_peak = sum(c["peak"] for c in counts)
    print(f"\nstatuses {sorted(statuses)}; peak in flight per instance {[c['peak'] for c in counts]}")
    assert statuses.count(200) >= 4
    assert peak <= 4 and total_peak <= 8
    refused = [r for r in results if r[0] == 429]
    assert len(refused) >= 24 - 8  # one replica alone would have let 4 each through: 12
    assert all(r[1]["error"]["code"] == "concurrency_limit_exceeded" for r in refused)
    assert all(int(r[2]["Retry-After"]) >= 1 for r in refused)
    # the slots came back (freed off the request path, one round trip after each answer)
    await asyncio.sleep(0.1)
    again = await asyncio.gather(*(chat(gws[i % 3], f"again{i}") for i in range(4)))
    assert [s for s, _, _ in again] == [200] * 4


async def test_the_instances_never_see_more_than_the_limit_in_flight(
    upstreams: Any, replicas: Any, key_prefix: str
) -> None:
    """Counted at the instances over several waves: the sum of what every instance holds at once."""
    ups = await upstreams(3)
    total = {"now": 0, "peak": 0}
    for u in ups:
        answer = u._answer

        async def counted(request: Any, *, chat: bool, answer: Any = answer) -> Any:
            total["now"] += 1
            total["peak"] = max(total["peak"], total["now"])
            try:
                return await answer(request, chat=chat)
            finally:
                total["now"] -= 1

        u._answer = counted
        u.answer_delay_s = 0.05
    gws = await replicas(
        3, ups, url=SHARED_URL, prefix=key_prefix, router="round-robin", tenants=tenants(max_concurrency=5)
    )
    statuses: list[int] = []

    async def caller(i: int) -> None:  # 15 callers, 5 per replica, 4 requests each
        for j in range(4):
            status, _, _ = await chat(gws[i % 3], f"w{i}-{j}")
            statuses.append(status)
            if status == 429:
                await asyncio.sleep(0.02)

    await asyncio.gather(*(caller(i) for i in range(15)))
    print(f"\npeak in flight at the instances {total['peak']}; statuses {sorted(set(statuses))}")
    assert total["peak"] <= 5
    assert set(statuses) == {200, 429}
    assert statuses.count(200) >= 5


async def test_requests_per_minute_hold_across_replicas_with_openai_errors(
    upstreams: Any, replicas: Any, key_prefix: str
) -> None:
    ups = await upstreams(2)
    gws = await replicas(3, ups, url=SHARED_URL, prefix=key_prefix, tenants=tenants(rpm_limit=10))
    results = await asyncio.gather(*(chat(gws[i % 3], f"r{i}") for i in range(30)))
    assert sum(s == 200 for s, _, _ in results) == 10
    assert sum(len(u.requests) for u in ups) == 10
    client = gws[1].client(KEY)
    with pytest.raises(openai.RateLimitError) as info:
        await client.chat.completions.create(
            model="llama-3-8b", messages=[{"role": "user", "content": "one more"}]
        )
    assert info.value.status_code == 429
    assert info.value.code == "rate_limit_exceeded"
    assert int(info.value.response.headers["Retry-After"]) >= 1
    # Each replica counts the refusals it made: which replica refused the 20 is a race, the sum is not.
    refused = [await refusals(gw, "tenant_rpm") for gw in gws]
    assert sum(refused) == 21, refused


async def test_an_instance_ejected_by_one_replica_is_ejected_by_all_within_a_second(
    upstreams: Any, replicas: Any, key_prefix: str, wait: Any
) -> None:
    ups = await upstreams(2)
    ups[1].mode = "fail"
    gws = await replicas(
        3,
        ups,
        url=SHARED_URL,
        prefix=key_prefix,
        router="round-robin",
        health={"interval_s": 60, "failures_to_down": 1000},
        breaker={"consecutive_failures": 2, "cooldown_s": 60},
    )
    await asyncio.sleep(0.2)  # every replica subscribed

    async def opened(gw: Any) -> bool:
        return (await gw.instances())["up-1"]["breaker"] == "open"

    for i in range(20):  # only replica 0 sees the failures
        await chat(gws[0], f"b{i}")
        if await opened(gws[0]):
            break
    assert await opened(gws[0])
    for gw in gws[1:]:
        await wait(lambda gw=gw: opened(gw), timeout_s=1.0)
    seen = len(ups[1].requests)
    for i in range(6):
        status, _, _ = await chat(gws[1 + i % 2], f"after{i}")
        assert status == 200
    assert len(ups[1].requests) == seen  # the other replicas never tried it
    metrics = await gws[1].get("/metrics")
    assert 'reason="peer_opened"' in metrics


async def test_a_conversation_reaches_the_same_instance_through_any_replica(
    upstreams: Any, replicas: Any, key_prefix: str
) -> None:
    ups = await upstreams(3)
    for u in ups:
        u.answer_delay_s = 0.2  # the first turns overlap, so least-loaded spreads them
    gws = await replicas(3, ups, url=SHARED_URL, prefix=key_prefix, router="prefix-affinity")
    system = "You are a careful assistant. " * 60

    def messages(conv: int, turns: int) -> list[dict[str, str]]:
        out = [{"role": "system", "content": f"conversation {conv}. " + system}]
        for t in range(turns):
            out.append({"role": "user", "content": f"conv {conv} turn {t}: tell me more about topic {t}"})
            out.append({"role": "assistant", "content": "tok " * 4})
        out.append({"role": "user", "content": f"conv {conv} turn {turns}: and then?"})
        return out

    def served_by(conv: int, turn: int) -> str:
        marker = f"conv {conv} turn {turn}: "
        return next(u.name for u in ups for r in u.requests if marker in r["messages"][-1]["content"])

    convs = range(3)
    first = await asyncio.gather(
        *(
            gws[0].post("/v1/chat/completions", {"model": "llama-3-8b", "messages": messages(c, 0)})
            for c in convs
        )
    )
    assert all(s == 200 for s, _, _ in first)
    home = {c: served_by(c, 0) for c in convs}
    assert len(set(home.values())) > 1  # else any replica would find them by least load alone
    hits = total = 0
    for turn in range(1, 4):
        await asyncio.sleep(0.1)  # a user reads the answer; the decision reached the others
        for c in convs:
            gw = gws[(c + turn) % 3]
            status, _, _ = await gw.post(
                "/v1/chat/completions", {"model": "llama-3-8b", "messages": messages(c, turn)}
            )
            assert status == 200
            total += 1
            hits += served_by(c, turn) == home[c]
    print(f"\nturns on their conversation's instance through other replicas: {hits}/{total}")
    assert hits == total


async def test_redis_down_requests_flow_on_local_state_and_converge_after(
    upstreams: Any, replicas: Any, private_redis: PrivateRedis, wait: Any
) -> None:
    import redis

    ups = await upstreams(2)
    gws = await replicas(
        2,
        ups,
        url=private_redis.url,
        prefix="tp:",
        state={"timeout_s": 0.2, "retry_connect_s": 0.1},
        tenants=tenants(max_concurrency=8, rpm_limit=100_000),
    )

    async def up(gw: Any) -> float:
        text = await gw.get("/metrics")
        line = next(x for x in text.splitlines() if x.startswith("tokenplane_state_backend_up "))
        return float(line.split()[1])

    assert [s for s, _, _ in await asyncio.gather(*(chat(g, "before") for g in gws))] == [200, 200]
    private_redis.kill()
    statuses = [s for s, _, _ in await asyncio.gather(*(chat(gws[i % 2], f"down{i}") for i in range(12)))]
    assert statuses == [200] * 12  # fail open: nothing refused for want of Redis
    for gw in gws:
        assert await up(gw) == 0.0
        metrics = await gw.get("/metrics")
        assert 'tokenplane_state_fail_open_total{operation="acquire"}' in metrics
    private_redis.start()
    for gw in gws:
        await wait(lambda gw=gw: _is_up(up, gw), timeout_s=5.0)
    assert [s for s, _, _ in await asyncio.gather(*(chat(g, "after") for g in gws))] == [200, 200]
    client = redis.Redis(port=private_redis.port)
    try:
        assert b"tp:rpm:acme" in client.keys("*")  # shared again
    finally:
        client.close()


async def _is_up(up: Callable[[Any], Awaitable[float]], gw: Any) -> bool:
    return await up(gw) == 1.0


async def test_the_retry_budget_is_the_fleets_not_each_replicas(
    upstreams: Any, replicas: Any, key_prefix: str
) -> None:
    """Every instance failing: retries across three replicas stay within one budget (its floor of
    ``min_per_s`` x ``window_s`` retries), not three."""
    ups = await upstreams(2)
    for u in ups:
        u.mode = "fail"
    floor = 1.0 * 10.0  # min_per_s x window_s: 10 retries in the window for the whole fleet
    gws = await replicas(
        3,
        ups,
        url=SHARED_URL,
        prefix=key_prefix,
        state={"sync_interval_s": 0.05},
        router="round-robin",
        health={"interval_s": 60, "failures_to_down": 1000},
        breaker={"consecutive_failures": 1000, "min_requests": 1000},
        retry={
            "budget_ratio": 0.0,
            "min_per_s": 1.0,
            "window_s": 10.0,
            "min_tokens_per_s": 1e9,
            "max_attempts": 2,  # one retry, always to the other instance
            "backoff_base_s": 0.0,
        },
    )
    n = 30
    for i in range(n):
        status, _, _ = await chat(gws[i % 3], f"f{i}")
        assert status in (502, 503)
        await asyncio.sleep(0.03)
    retries = sum(len(u.requests) for u in ups) - n
    print(
        f"\nretries across 3 replicas: {retries} (one budget: {floor:.0f}; one per replica: {3 * floor:.0f})"
    )
    # the budget's floor, plus what the others spend within one sync period before a replica hears
    assert retries <= floor + 5
    assert retries >= floor  # the budget was used, not refused outright


async def test_a_killed_replicas_slots_come_back_within_the_lease(
    upstreams: Any, replicas: Any, key_prefix: str, names: Any, tmp_path: Path, wait: Any
) -> None:
    """A replica (a real ``tokenplane serve`` process) is SIGKILLed holding the tenant's every
    slot: its clients see a connection error, and the other replica admits again once the leases
    expire (``lease_ttl_s``), not never."""
    import os
    import signal
    import subprocess

    import aiohttp
    import yaml
    from ports import free_port

    ups = await upstreams(1)
    ups[0].answer_delay_s = 30.0
    state = {"backend": "redis", "url": SHARED_URL, "key_prefix": key_prefix, "lease_ttl_s": 1.0}
    config = names.gateway_config(ups, tenants=tenants(max_concurrency=2), state=state)
    port = free_port()
    config["listen"] = {"host": "127.0.0.1", "port": port}
    path = tmp_path / "replica.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([sys.executable, "-m", "tokenplane", "serve", str(path)])
    other = (await replicas(1, ups, url=SHARED_URL, prefix=key_prefix, tenants=tenants(max_concurrency=2)))[0]
    body = {"model": "llama-3-8b", "messages": [{"role": "user", "content": "long"}]}
    headers = {"Authorization": f"Bearer {KEY}"}
    try:
        async with aiohttp.ClientSession() as http:

            async def healthy() -> bool:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/health") as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            await wait(healthy, timeout_s=30.0)

            async def held() -> int:
                async with http.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=headers
                ) as r:
                    return r.status

            doomed = [asyncio.create_task(held()) for _ in range(2)]
            await wait(lambda: _true(len(ups[0].requests) >= 2), timeout_s=10.0)
            status, err, _ = await chat(other, "refused while the slots are held")
            assert status == 429 and err["error"]["code"] == "concurrency_limit_exceeded"
            ups[0].answer_delay_s = 0.0
            os.kill(proc.pid, signal.SIGKILL)
            killed_at = asyncio.get_running_loop().time()
            outcomes = await asyncio.gather(*doomed, return_exceptions=True)
            assert all(isinstance(o, aiohttp.ClientError) for o in outcomes)  # an error, never an answer

            async def admitted() -> bool:
                return (await chat(other, "after the kill"))[0] == 200

            await wait(admitted, timeout_s=3.0)
            healed_s = asyncio.get_running_loop().time() - killed_at
            print(f"\nslots back {healed_s:.2f} s after the SIGKILL (lease_ttl_s 1.0)")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


async def _true(value: bool) -> bool:
    return value
