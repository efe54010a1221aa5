"""Breaker transitions and routing decisions between gateway replicas, by Redis pub/sub.

One channel (``<key_prefix>events``) carries two kinds of msgpack message, each tagged with the
sending replica's id so that a replica ignores its own:

* ``("b", replica, instance, "open" | "closed", cooldown_s)``: a breaker transition this replica
  made (not one it adopted); every other replica opens (or closes) its own at once for the same
  cooldown: milliseconds, well within one second.
* ``("p", replica, [(model, instance, block hashes), ...])``: routing decisions, batched every
  ``sync_interval_s`` (100 ms by default) and inserted into the other replicas' approximate prefix
  indexes (:mod:`~tokenplane.shared_state.routing`), so the next turn of a conversation finds its
  instance through any replica. A turn is published when it is routed, before its answer: the next
  turn, sent after that answer, misses it only if the answer came back within one batch plus
  pub/sub delivery.

Messages published while a replica's subscription was down are lost to it: its own breakers still
open on its own failures, and the prefix index converges as turns are routed. The subscription is
retried every ``retry_connect_s``; a failure marks the whole link down, as any Redis call does
(:class:`~tokenplane.shared_state.redis_backend.RedisState`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

import msgspec
import redis.asyncio as aioredis

from tokenplane.gateway.config import StateConfig
from tokenplane.shared_state.state_metrics import StateMetrics

log = logging.getLogger(__name__)

BreakerHandler = Callable[[str, str, float], None]
"""(instance id, "open" | "closed", cooldown s) from another replica."""
PrefixHandler = Callable[[str, str, Sequence[int]], None]
"""(model, instance id, block hashes) routed by another replica."""


class Link(Protocol):
    """What the channel uses of its replica's link to Redis."""

    config: StateConfig
    replica_id: str
    metrics: StateMetrics
    client: aioredis.Redis
    up: bool
    failures: tuple[type[BaseException], ...]

    def fail(self, operation: str, exc: BaseException) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...


class PeerChannel:
    """One replica's end of the channel (see the module docstring)."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.channel = link.config.key_prefix + "events"
        self.on_breaker: BreakerHandler | None = None
        self.on_prefix: PrefixHandler | None = None
        self._routed: list[tuple[str, str, list[int]]] = []
        self._routed_scheduled = False

    def publish_breaker(self, instance_id: str, state: str, cooldown_s: float) -> None:
        """Tell the other replicas of a breaker transition this replica made (not one it adopted)."""
        message = msgspec.msgpack.encode(("b", self.link.replica_id, instance_id, state, cooldown_s))
        self.link.spawn(self._publish(message))

    def publish_routed(self, model: str, instance_id: str, block_hashes: Sequence[int]) -> None:
        """Queue a routing observation; sent with the others every ``sync_interval_s``."""
        self._routed.append((model, instance_id, list(block_hashes)))
        if not self._routed_scheduled:
            self._routed_scheduled = True
            asyncio.get_running_loop().call_later(self.link.config.sync_interval_s, self._flush_routed)

    def _flush_routed(self) -> None:
        self._routed_scheduled = False
        routed, self._routed = self._routed, []
        if routed and self.link.up:
            self.link.spawn(self._publish(msgspec.msgpack.encode(("p", self.link.replica_id, routed))))

    async def _publish(self, message: bytes) -> None:
        link = self.link
        if not link.up:
            return
        try:
            await link.client.publish(self.channel, message)
        except link.failures as exc:
            link.fail("publish", exc)

    async def listen(self) -> None:
        """Receive the other replicas' messages; resubscribe after a failure (runs until cancelled)."""
        link = self.link
        while True:
            pubsub = link.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None:
                        self._on_message(message["data"])
            except link.failures as exc:
                link.fail("subscribe", exc)
            finally:
                with contextlib.suppress(*link.failures):
                    # (untyped before redis-py 8.2, typed from it: no ignore fits both)
                    aclose: Any = pubsub.aclose
                    await aclose()
            await asyncio.sleep(link.config.retry_connect_s)

    def _on_message(self, data: bytes) -> None:
        try:
            message = msgspec.msgpack.decode(data)
        except msgspec.DecodeError:
            log.warning("shared state: undecodable message on %s", self.channel)
            return
        if message[1] == self.link.replica_id:
            return
        events = self.link.metrics.peer_events
        if message[0] == "b" and self.on_breaker is not None:
            events.labels("breaker").inc()
            self.on_breaker(message[2], message[3], float(message[4]))
        elif message[0] == "p" and self.on_prefix is not None:
            events.labels("routed").inc(len(message[2]))
            for model, instance_id, hashes in message[2]:
                self.on_prefix(model, instance_id, hashes)
