"""The in-flight work per instance shared between replicas, against a real Redis: each replica
reads the others' sums, a snapshot replaces the last (nothing accumulates), a dead replica's share
leaves within the TTL, and a Redis failure drops the peers' figures."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry
from redis_server import SHARED_URL

from tokenplane.gateway.config import StateConfig
from tokenplane.shared_state.in_flight import TTL_S, PeerLoad, SharedInFlight, ttl_s
from tokenplane.shared_state.redis_backend import RedisState

pytestmark = pytest.mark.anyio


class Replica:
    """A replica's own in-flight figures (set by the test) and the peers' as last applied."""

    def __init__(self, prefix: str) -> None:
        config = StateConfig(backend="redis", url=SHARED_URL, key_prefix=prefix, sync_interval_s=0.02)
        self.state = RedisState(config, CollectorRegistry())
        self.own: dict[str, tuple[int, int]] = {}
        self.seen: PeerLoad = {}
        self.state.in_flight(SharedInFlight(self._own, self._apply))

    def _own(self) -> list[tuple[str, int, int]]:
        return [(i, n, t) for i, (n, t) in self.own.items()]

    def _apply(self, peers: PeerLoad) -> None:
        self.seen = dict(peers)


async def until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def test_only_work_in_flight_is_sent_and_replies_are_parsed() -> None:
    applied: list[PeerLoad] = []
    shared = SharedInFlight(lambda: [("i0", 2, 300), ("i1", 0, 0)], applied.append)
    assert shared.take_own() == ["i0", 2, 300]
    shared.merge([b"i0", 1, 100, b"i1", 3, 900])
    assert applied == [{"i0": (1, 100), "i1": (3, 900)}]
    shared.isolate()
    assert applied[-1] == {}
    assert ttl_s(0.1) == TTL_S and ttl_s(1.0) == 5.0


async def test_each_replica_sees_the_others_sums_and_nothing_accumulates(key_prefix: str) -> None:
    a, b, c = Replica(key_prefix), Replica(key_prefix), Replica(key_prefix)
    a.own = {"i0": (2, 300)}
    b.own = {"i0": (1, 100), "i1": (3, 900)}
    for r in (a, b, c):
        await r.state.start()
    try:
        await until(lambda: c.seen == {"i0": (3, 400), "i1": (3, 900)})
        await until(lambda: a.seen == {"i0": (1, 100), "i1": (3, 900)} and b.seen == {"i0": (2, 300)})
        a.own = {}  # a's requests ended (answered, failed or cancelled: its count is back to 0)
        await until(lambda: b.seen == {} and c.seen == {"i0": (1, 100), "i1": (3, 900)})
        await asyncio.sleep(0.2)  # ten syncs later: the same figures, not more
        assert c.seen == {"i0": (1, 100), "i1": (3, 900)}
    finally:
        for r in (a, b, c):
            await r.state.stop()


async def test_a_dead_replicas_share_leaves_within_the_ttl(key_prefix: str) -> None:
    dead, alive = Replica(key_prefix), Replica(key_prefix)
    dead.own = {"i0": (4, 4000)}
    await dead.state.start()
    await alive.state.start()
    try:
        await until(lambda: alive.seen == {"i0": (4, 4000)})
        while not all(task.done() for task in dead.state._tasks):  # killed: no syncs, no clean-up
            for task in dead.state._tasks:  # (again: a cancel during a call can be swallowed)
                task.cancel()
            await asyncio.sleep(0.01)
        started = asyncio.get_running_loop().time()
        await until(lambda: alive.seen == {}, timeout_s=TTL_S + 2)
        assert asyncio.get_running_loop().time() - started <= TTL_S + 0.5
    finally:
        await alive.state.stop()
        await dead.state.stop()


async def test_redis_failure_drops_the_peers_figures(key_prefix: str) -> None:
    a, b = Replica(key_prefix), Replica(key_prefix)
    b.own = {"i0": (1, 100)}
    await a.state.start()
    await b.state.start()
    try:
        await until(lambda: a.seen == {"i0": (1, 100)})
        a.state.fail("test", OSError("pretend Redis went away"))
        assert a.seen == {}  # on its own figures (the estimate scales them by the scrape)
        await until(lambda: a.seen == {"i0": (1, 100)})  # back once Redis answers
    finally:
        await a.state.stop()
        await b.state.stop()
