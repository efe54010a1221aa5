"""Breaker and routing messages between replicas over a real Redis's pub/sub."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis
from prometheus_client import CollectorRegistry
from redis_server import SHARED_URL

from tokenplane.gateway.config import StateConfig
from tokenplane.shared_state.redis_backend import RedisState

pytestmark = pytest.mark.anyio


def replica(url: str, prefix: str, **config: float) -> RedisState:
    return RedisState(StateConfig(backend="redis", url=url, key_prefix=prefix, **config), CollectorRegistry())


async def test_breaker_and_routing_messages_reach_the_other_replicas(key_prefix: str) -> None:
    a, b = replica(SHARED_URL, key_prefix), replica(SHARED_URL, key_prefix)
    got_breaker: list[tuple[str, str, float]] = []
    got_routed: list[tuple[str, str, list[int]]] = []
    b.peers.on_breaker = lambda *m: got_breaker.append(m)
    b.peers.on_prefix = lambda model, iid, hashes: got_routed.append((model, iid, list(hashes)))
    a.peers.on_breaker = lambda *m: pytest.fail("a replica adopted its own message")
    await a.start()
    await b.start()
    try:
        await asyncio.sleep(0.1)  # subscribed
        a.peers.publish_breaker("emu-1", "open", 5.0)
        a.peers.publish_routed("m", "emu-2", [1, 2, 2**63 + 5])
        for _ in range(100):
            if got_breaker and got_routed:
                break
            await asyncio.sleep(0.01)
        assert got_breaker == [("emu-1", "open", 5.0)]
        assert got_routed == [("m", "emu-2", [1, 2, 2**63 + 5])]
    finally:
        await a.stop()
        await b.stop()


async def test_garbage_on_the_channel_is_logged_and_the_next_message_still_arrives(
    key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    b = replica(SHARED_URL, key_prefix)
    got: list[tuple[str, str, float]] = []
    b.peers.on_breaker = lambda *m: got.append(m)
    sender = replica(SHARED_URL, key_prefix)
    await b.start()
    await sender.start()
    plain = redis.Redis.from_url(SHARED_URL)
    try:
        await asyncio.sleep(0.1)  # subscribed
        with caplog.at_level(logging.WARNING):
            plain.publish(b.peers.channel, b"\xc1 not msgpack")
            sender.peers.publish_breaker("emu-3", "closed", 0.0)
            for _ in range(100):
                if got:
                    break
                await asyncio.sleep(0.01)
        assert got == [("emu-3", "closed", 0.0)]
        assert "undecodable message" in caplog.text
    finally:
        plain.close()
        await sender.stop()
        await b.stop()
