"""Avoid, Share, Move, Delay at the gateway, with fake upstreams and the official ``openai`` client.

Avoid: the exact response cache for deterministic requests (hit, tenant isolation, TTL, size bound,
temperature > 0 never cached, stream replay). Share: the views the routers see carry each
instance's outstanding tokens (the ``outstanding-tokens`` scorer's signal). Move: the fallback chain
by quality class and on an overloaded primary. Delay: deferrable requests wait for spare capacity
and expire with 503 at their deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from tokenplane.gateway import create_app, hash_key, parse_config
from tokenplane.gateway.app import GATEWAY_KEY
from tokenplane.gateway.config import ResponseCacheConfig
from tokenplane.gateway.response_cache import CacheMetrics, ResponseCache, is_deterministic

pytestmark = pytest.mark.anyio

OTHER_KEY = "sk-test-other"
LAZY_KEY = "sk-test-lazy"
MESSAGES = [{"role": "user", "content": "what is two plus two?"}]


def _conftest() -> Any:
    for mod in list(sys.modules.values()):
        if hasattr(mod, "FakeUpstream") and hasattr(mod, "gateway_config") and hasattr(mod, "RunningGateway"):
            return mod
    raise AssertionError("the gateway tests' conftest is not loaded")


def _config(
    primary: list[Any],
    fallback: list[Any] | None = None,
    *,
    cache: dict[str, Any] | None = None,
    chain: list[dict[str, Any]] | None = None,
    deferral: dict[str, Any] | None = None,
    max_concurrency: int = 64,
) -> dict[str, Any]:
    c = _conftest()
    cfg: dict[str, Any] = c.gateway_config(primary, router="round-robin", extra_model=fallback is not None)
    cfg["tenants"] = [
        {"name": "acme", "priority": "interactive", "api_keys": [hash_key(c.KEY)], "allow_deferrable": True},
        {"name": "other", "priority": "standard", "api_keys": [hash_key(OTHER_KEY)]},
        {"name": "lazy", "priority": "deferrable", "api_keys": [hash_key(LAZY_KEY)]},
    ]
    m = cfg["models"][0]
    if cache is not None:
        m["response_cache"] = cache
    if chain is not None:
        m["fallback"] = chain
    if deferral is not None:
        m["deferral"] = deferral
    for inst in cfg["instances"]:
        inst["max_concurrency"] = max_concurrency
    for u in fallback or ():
        cfg["instances"].append({"id": u.name, "url": u.url, "model": c.OTHER_MODEL, "kind": "vllm"})
    return cfg


@pytest.fixture
async def start(anyio_backend: str) -> AsyncIterator[Callable[[dict[str, Any]], Awaitable[Any]]]:
    c = _conftest()
    running: list[Any] = []

    async def make(cfg: dict[str, Any]) -> Any:
        server = TestServer(create_app(parse_config(cfg)), host="127.0.0.1", port=0)
        await server.start_server()
        gw = c.RunningGateway(server, aiohttp.ClientSession())
        running.append(gw)
        return gw

    yield make
    for gw in running:
        for client in gw.clients:
            await client.close()
        await gw.http.close()
        with contextlib.suppress(Exception):
            await gw.server.close()


async def _chat(client: openai.AsyncOpenAI, model: str, **kw: Any) -> Any:
    return await client.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, **kw)


async def _metrics(gw: Any) -> str:
    text: str = await gw.get("/metrics")
    return text


# -- Avoid ----------------------------------------------------------------------------------------


async def test_deterministic_request_is_answered_from_the_cache_per_tenant(upstreams, start, names) -> None:
    (up,) = await upstreams(1)
    gw = await start(_config([up], cache={"ttl_s": 60}))
    acme = gw.client()
    first = await _chat(acme, names.MODEL, temperature=0)
    assert first.headers.get("x-tokenplane-cache") == "miss"
    second = await _chat(acme, names.ALIAS, temperature=0)  # an alias hits the same entry
    assert second.headers.get("x-tokenplane-cache") == "hit"
    assert second.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert second.parse().id == first.parse().id  # the stored answer, byte for byte
    assert len(up.requests) == 1

    other = await _chat(gw.client(OTHER_KEY), names.MODEL, temperature=0)
    assert other.headers.get("x-tokenplane-cache") == "miss"  # tenants never share entries
    assert len(up.requests) == 2

    seeded = [await _chat(acme, names.MODEL, temperature=0.9, seed=7) for _ in range(2)]
    assert [r.headers.get("x-tokenplane-cache") for r in seeded] == ["miss", "hit"]
    assert len(up.requests) == 3

    # A streaming request is served from the stored answer, replayed as SSE.
    opts = {"include_usage": True}
    stream = await acme.chat.completions.create(
        model=names.MODEL, messages=MESSAGES, temperature=0, stream=True, stream_options=opts
    )
    text = ""
    usage = None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        usage = chunk.usage or usage
    assert text == first.parse().choices[0].message.content
    assert usage is not None and usage.completion_tokens == up.tokens
    assert len(up.requests) == 3

    metrics = await _metrics(gw)
    assert f'tokenplane_response_cache_total{{model="{names.MODEL}",result="hit"}} 3.0' in metrics
    assert f'tokenplane_response_cache_total{{model="{names.MODEL}",result="store"}} 3.0' in metrics


async def test_non_deterministic_and_failed_requests_are_never_cached(upstreams, start, names) -> None:
    (up,) = await upstreams(1)
    gw = await start(_config([up], cache={}))
    acme = gw.client()
    for _ in range(2):
        r = await _chat(acme, names.MODEL, temperature=0.7)
        assert r.headers.get("x-tokenplane-cache") is None
    for _ in range(2):
        await _chat(acme, names.MODEL, temperature=0, n=2)
    assert len(up.requests) == 4
    up.mode = "reject"
    for _ in range(2):
        with pytest.raises(openai.BadRequestError):
            await _chat(acme, names.MODEL, temperature=0, max_tokens=5)
    assert len(up.requests) == 6


async def test_ttl_and_entry_bound_evict(upstreams, start, names) -> None:
    (up,) = await upstreams(1)
    gw = await start(_config([up], cache={"ttl_s": 0.3, "max_entries": 2}))
    acme = gw.client()
    await _chat(acme, names.MODEL, temperature=0, max_tokens=1)

    async def cached(max_tokens: int) -> str:
        r = await _chat(acme, names.MODEL, temperature=0, max_tokens=max_tokens)
        return str(r.headers["x-tokenplane-cache"])

    assert await cached(1) == "hit"
    await asyncio.sleep(0.4)
    assert await cached(1) == "miss"
    await cached(2)
    await cached(3)  # evicts max_tokens=1, the least recently used
    assert await cached(1) == "miss"
    assert len(up.requests) == 5
    cache = gw.server.app[GATEWAY_KEY].response_caches[names.MODEL]
    assert len(cache) == 2


def test_cache_byte_bound_and_keys() -> None:
    from prometheus_client import CollectorRegistry

    now = [0.0]
    config = ResponseCacheConfig(ttl_s=10, max_entries=100, max_bytes=100)
    cache = ResponseCache("m", config, CacheMetrics(CollectorRegistry()), lambda: now[0])
    keys = [cache.key("t", "chat", {"messages": [], "temperature": 0, "max_tokens": i}) for i in range(3)]
    assert all(k is not None for k in keys)
    for k in keys:
        assert k is not None
        cache.put(k, b"x" * 40)
    assert len(cache) == 2 and cache.bytes == 80  # the first went to stay under 100 bytes
    assert keys[0] is not None and cache.get(keys[0]) is None
    cache.put(keys[0], b"y" * 101)  # larger than the bound: not stored
    assert cache.get(keys[0]) is None
    assert keys[2] is not None and cache.get(keys[2]) == b"x" * 40
    now[0] = 10.5  # past the TTL: dropped when met
    assert cache.get(keys[2]) is None and len(cache) == 1
    # Key order, stream flags and user do not matter; the tenant does.
    a = cache.key("t", "chat", {"temperature": 0, "messages": [1], "stream": True, "user": "u"})
    b = cache.key("t", "chat", {"messages": [1], "temperature": 0})
    assert a == b and a != cache.key("u", "chat", {"messages": [1], "temperature": 0})
    assert not is_deterministic({"temperature": 0.2}) and not is_deterministic({})
    assert is_deterministic({"seed": 3}) and not is_deterministic({"seed": 3, "n": 2})


# -- Share ----------------------------------------------------------------------------------------


async def test_views_carry_outstanding_tokens(upstreams, start, names) -> None:
    (up,) = await upstreams(1)
    up.tokens = 6
    up.token_delay_s = 0.1
    gw = await start(_config([up]))
    gateway = gw.server.app[GATEWAY_KEY]
    stream = await gw.client().chat.completions.create(
        model=names.MODEL, messages=MESSAGES, max_tokens=50, stream=True
    )
    async for _ in stream:
        (view,) = [u.view() for u in gateway.pool.for_model(names.MODEL)]
        assert view.outstanding_tokens > 50  # prompt + max_tokens of the request in flight
        break
    await stream.close()


# -- Move -----------------------------------------------------------------------------------------


async def test_quality_class_decides_the_fallback(upstreams, start, names) -> None:
    big, small = await upstreams(2)
    chain = [{"model": names.OTHER_MODEL, "when": ["overloaded", "quality_ok"], "quality": "standard"}]
    gw = await start(_config([big], [small], chain=chain))
    acme = gw.client()

    best = await _chat(acme, names.MODEL, extra_headers={"x-tokenplane-quality": "best"})
    assert best.parse().model == names.UPSTREAM_MODEL
    assert best.headers.get("x-tokenplane-served-by") is None
    plain = await _chat(acme, names.MODEL)  # no stated class: no move for quality
    assert plain.parse().model == names.UPSTREAM_MODEL

    cheap = await _chat(acme, names.MODEL, extra_headers={"x-tokenplane-quality": "any"})
    assert cheap.parse().model == names.OTHER_MODEL
    assert cheap.headers["x-tokenplane-served-by"] == names.OTHER_MODEL
    meta = await _chat(acme, names.MODEL, metadata={"quality": "standard"})
    assert meta.parse().model == names.OTHER_MODEL
    assert len(big.requests) == 2 and len(small.requests) == 2

    metrics = await _metrics(gw)
    labels = f'from="{names.MODEL}",reason="quality_ok",to="{names.OTHER_MODEL}"'
    line = f"tokenplane_fallbacks_total{{{labels}}} 2.0"
    assert line in metrics


async def test_overloaded_primary_moves_to_the_fallback(upstreams, start, names, wait) -> None:
    big, small = await upstreams(2)
    chain = [{"model": names.OTHER_MODEL, "when": ["overloaded"]}]
    gw = await start(_config([big], [small], chain=chain, max_concurrency=1))
    acme = gw.client()

    # Saturated: the one slot of the primary is taken by a slow stream.
    big.tokens, big.token_delay_s = 10, 0.1
    stream = await acme.chat.completions.create(model=names.MODEL, messages=MESSAGES, stream=True)
    moved = await _chat(acme, names.MODEL, extra_headers={"x-tokenplane-quality": "any"})
    assert moved.parse().model == names.OTHER_MODEL
    assert moved.headers["x-tokenplane-served-by"] == names.OTHER_MODEL
    async for _ in stream:
        pass
    # Free again: the primary serves (this link moves only on overload, whatever the class).
    again = await _chat(acme, names.MODEL, extra_headers={"x-tokenplane-quality": "any"})
    assert again.parse().model == names.UPSTREAM_MODEL

    # Down: no usable instance on the primary.
    big.healthy = False

    async def down() -> bool:
        return not (await gw.instances())[big.name]["healthy"]

    await wait(down)
    out = await _chat(acme, names.MODEL)
    assert out.parse().model == names.OTHER_MODEL
    # A request that needs the best quality stays, and meets the primary's state (503).
    with pytest.raises(openai.APIStatusError) as err:
        await _chat(acme, names.MODEL, extra_headers={"x-tokenplane-quality": "best"})
    assert err.value.status_code == 503
    metrics = await _metrics(gw)
    labels = f'from="{names.MODEL}",reason="overloaded",to="{names.OTHER_MODEL}"'
    line = f"tokenplane_fallbacks_total{{{labels}}} 2.0"
    assert line in metrics


# -- Delay ----------------------------------------------------------------------------------------


async def test_deferrable_requests_wait_for_spare_capacity(upstreams, start, names) -> None:
    (up,) = await upstreams(1)
    up.tokens, up.token_delay_s = 8, 0.1
    gw = await start(_config([up], max_concurrency=2, deferral={"spare_fraction": 0.5, "max_wait_s": 10}))
    acme = gw.client()
    stream = await acme.chat.completions.create(model=names.MODEL, messages=MESSAGES, stream=True)
    started = time.monotonic()
    lazy = asyncio.create_task(_chat(gw.client(LAZY_KEY), names.MODEL))
    flagged = asyncio.create_task(_chat(acme, names.MODEL, extra_headers={"x-tokenplane-deferrable": "true"}))
    await asyncio.sleep(0.3)
    assert not lazy.done() and not flagged.done()
    assert len(up.requests) == 1  # both wait although the pool has a free slot: 1 of 2 is not spare
    async for _ in stream:
        pass
    await asyncio.wait_for(asyncio.gather(lazy, flagged), 5)
    assert lazy.result().parse().choices[0].message.content
    assert time.monotonic() - started >= 0.5
    assert len(up.requests) == 3
    # An idle pool: a deferrable request goes at once.
    quick = time.monotonic()
    await _chat(gw.client(LAZY_KEY), names.MODEL)
    assert time.monotonic() - quick < 0.5


async def test_deferrable_requests_expire_and_are_bounded(upstreams, start, names) -> None:
    (up,) = await upstreams(1)
    up.tokens, up.token_delay_s = 20, 0.1
    gw = await start(_config([up], max_concurrency=2, deferral={"max_wait_s": 0.3, "max_waiting": 1}))
    stream = await gw.client().chat.completions.create(model=names.MODEL, messages=MESSAGES, stream=True)
    lazy = gw.client(LAZY_KEY)
    waiting = asyncio.create_task(_chat(lazy, names.MODEL))
    await asyncio.sleep(0.05)
    status, body, headers = await gw.post(
        "/v1/chat/completions", {"model": names.MODEL, "messages": MESSAGES}, key=LAZY_KEY
    )
    assert status == 503 and body["error"]["code"] == "deferral_queue_full" and "Retry-After" in headers
    with pytest.raises(openai.APIStatusError) as err:
        await waiting
    assert err.value.status_code == 503
    assert err.value.response.headers.get("retry-after") is not None
    assert "deferral_expired" in err.value.response.text
    assert len(up.requests) == 1
    # The tenant without allow_deferrable cannot ask for it: its request goes at once.
    ok = await _chat(gw.client(OTHER_KEY), names.MODEL, extra_headers={"x-tokenplane-deferrable": "true"})
    assert ok.parse().choices
    await stream.close()
