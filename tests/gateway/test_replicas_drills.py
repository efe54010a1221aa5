"""Failure drills under three-replica load: Redis stopped, PostgreSQL restarted.

Three replicas (each its own gateway, real HTTP) share a ``redis-server`` and a PostgreSQL
ledger; 12 callers keep sending one-step workflows (``x-tokenplane-workflow-id``) through them,
each to the next replica, while the drill stops one of the two and brings it back. Each drill
leaves:

* every request the callers sent with a terminal outcome they saw (an HTTP status; none lost to a
  connection error or a hang);
* the ledger equal to the callers' view, read straight from PostgreSQL: one ok attempt for each
  workflow a caller saw succeed, no ok attempt for one it saw refused, no workflow nobody sent, and
  as many attempts as the instances received (none lost, none written twice);
* the figures back in band within 10 s of recovery: ``tokenplane_state_backend_up`` 1 on every
  replica (Redis); the ledger available again on every replica, its backlog written (no more
  queued than before the outage, or 20) and none dropped (PostgreSQL).

The outage lasts ``TOKENPLANE_DRILL_OUTAGE_S`` seconds: 2 in CI, the issue's 10 by command::

    TOKENPLANE_DRILL_OUTAGE_S=10 pytest tests/gateway/test_replicas_drills.py -s

Redis is a private ``redis-server`` on a free port and PostgreSQL a private cluster (``initdb`` and
``pg_ctl`` in a temporary directory, ``tests/support/pg_private.py``): the shared servers are
never stopped.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenplane.gateway import hash_key

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from pg_private import PrivatePostgres, available
from pg_support import database_url, fresh_database, in_schema
from redis_server import SHARED_URL, PrivateRedis

pytestmark = pytest.mark.anyio

KEY = "sk-test-acme"
OUTAGE_S = float(os.environ.get("TOKENPLANE_DRILL_OUTAGE_S", "2"))
RECOVERY_BAND_S = 10.0
CALLERS = 12
QUEUED_BAND = 20.0
"""Ledger writes a replica may have queued and still be in band (its callers' last answers)."""


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    if not available():
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) to run a private cluster")
    pg = PrivatePostgres()
    pg.start()
    try:
        yield pg
    finally:
        pg.remove()


@pytest.fixture
def shared_pg() -> Iterator[str]:
    with fresh_database() as name:
        yield database_url(name)


class Load:
    """The callers: one-step workflows through the replicas in turn until stopped."""

    def __init__(self, gws: list[Any]) -> None:
        self.gws = gws
        self.run_id = uuid.uuid4().hex[:6]
        self.outcomes: dict[str, int | str] = {}  # workflow id -> HTTP status, or "lost: ..."
        self.stopping = False
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._caller(i)) for i in range(CALLERS)]

    async def stop(self) -> None:
        self.stopping = True
        await asyncio.gather(*self._tasks)

    async def _caller(self, i: int) -> None:
        j = 0
        while not self.stopping:
            j += 1
            gw = self.gws[(i + j) % len(self.gws)]
            wf = f"drill-{self.run_id}-{i}-{j}"
            body = {"model": "llama-3-8b", "messages": [{"role": "user", "content": f"{wf} hello"}]}
            headers = {
                "Authorization": f"Bearer {KEY}",
                "x-tokenplane-workflow-id": wf,
                "x-tokenplane-step": "1",
                "x-tokenplane-total-steps": "1",
            }
            try:
                async with asyncio.timeout(15):
                    async with gw.http.post(gw.url + "/v1/chat/completions", json=body, headers=headers) as r:
                        await r.read()
                        self.outcomes[wf] = r.status
            except (OSError, TimeoutError) as exc:  # aiohttp's client errors are OSErrors
                self.outcomes[wf] = f"lost: {type(exc).__name__}: {exc}"
            await asyncio.sleep(0.005)


async def metric(gw: Any, name: str, **labels: str) -> float:
    text = await gw.get("/metrics")
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return float("nan")


async def within(seconds: float, check: Any) -> float:
    """Seconds until ``check()`` holds; fails past ``seconds``."""
    t0 = time.monotonic()
    while not await check():
        assert time.monotonic() - t0 < seconds, f"not back in band within {seconds} s"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


def check_ledger(url: str, load: Load, ups: list[Any]) -> dict[str, int]:
    """The ledger against the callers' view and the instances' count (see the module docstring)."""
    lost = {wf: o for wf, o in load.outcomes.items() if not isinstance(o, int)}
    assert not lost, f"requests without an outcome the caller saw: {list(lost.items())[:5]}"
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            b"SELECT workflow_id, count(*), sum(ok), count(DISTINCT write_id) FROM ledger_attempts"
            b" WHERE tenant = 'acme' GROUP BY workflow_id"
        ).fetchall()
    ledger = {str(wf): (int(n), int(ok), int(ids)) for wf, n, ok, ids in rows}
    served = {wf for wf, o in load.outcomes.items() if o == 200}
    refused = {wf for wf, o in load.outcomes.items() if o != 200}
    assert set(ledger) <= set(load.outcomes), "the ledger holds workflows nobody sent"
    missing = served - set(ledger)
    assert not missing, f"{len(missing)} workflows the callers saw succeed are not in the ledger"
    twice = {wf: v for wf, v in ledger.items() if v[0] != v[2] or (wf in served and v[:2] != (1, 1))}
    assert not twice, f"attempts lost or written twice: {list(twice.items())[:5]}"
    wrong = {wf for wf in refused if ledger.get(wf, (0, 0, 0))[1]}
    assert not wrong, f"refused by the gateway, yet ok in the ledger: {sorted(wrong)[:5]}"
    attempts = sum(n for n, _, _ in ledger.values())
    received = sum(len(u.requests) for u in ups)
    assert attempts == received, f"the instances received {received} requests, the ledger has {attempts}"
    return {"sent": len(load.outcomes), "ok": len(served), "refused": len(refused), "attempts": attempts}


@pytest.fixture
async def fleet(gateway: Any, upstreams: Any) -> AsyncIterator[Any]:
    async def make(state: dict[str, Any], ledger_url: str) -> tuple[list[Any], list[Any]]:
        ups = await upstreams(2)
        for u in ups:
            u.answer_delay_s = 0.01
        tenants = [{"name": "acme", "api_keys": [hash_key(KEY)], "max_concurrency": 64}]
        gws = [
            await gateway(
                ups,
                state={"backend": "redis", **state},
                ledger={"url": ledger_url, "timeout_s": 1.0},
                tenants=tenants,
            )
            for _ in range(3)
        ]
        return gws, ups

    yield make


async def test_redis_stopped_under_three_replica_load(
    fleet: Any, private_redis: PrivateRedis, shared_pg: str
) -> None:
    ledger_url = in_schema(shared_pg, "drill")
    # timeout_s: a reply slowed by a loaded machine is not an outage (the drill kills Redis)
    state = {"url": private_redis.url, "key_prefix": "tp:", "timeout_s": 1.0, "retry_connect_s": 0.2}
    gws, ups = await fleet(state, ledger_url)
    load = Load(gws)
    load.start()
    await asyncio.sleep(1.0)
    private_redis.kill()
    await asyncio.sleep(OUTAGE_S)
    during = dict(load.outcomes)
    private_redis.start()

    async def all_up() -> bool:
        return all([await metric(gw, "tokenplane_state_backend_up") == 1.0 for gw in gws])

    back_s = await within(RECOVERY_BAND_S, all_up)
    fell_back = [await metric(gw, "tokenplane_state_fail_open_total", operation="acquire") for gw in gws]
    await asyncio.sleep(1.0)
    still = [await metric(gw, "tokenplane_state_fail_open_total", operation="acquire") for gw in gws]
    await load.stop()

    async def flushed() -> bool:
        return all([await metric(gw, "tokenplane_ledger_buffered_writes") == 0.0 for gw in gws])

    await within(RECOVERY_BAND_S, flushed)
    figures = check_ledger(ledger_url, load, ups)
    print(f"\nRedis down {OUTAGE_S} s: {figures}; shared again {back_s:.2f} s after restart; "
          f"acquires on local state per replica {fell_back}")  # fmt: skip
    assert all(x > 0 for x in fell_back)  # the outage was felt by every replica
    assert still == fell_back  # after recovery, every request is decided by Redis again
    assert sum(1 for o in during.values() if o == 200) > 0  # requests flowed while Redis was down
    assert figures["refused"] == 0  # fail open: nothing refused for want of Redis


async def test_postgresql_restarted_under_three_replica_load(
    private_pg: PrivatePostgres, fleet: Any, key_prefix: str
) -> None:  # private_pg first: it is torn down after the gateways, which write to it as they stop
    ledger_url = private_pg.url
    gws, ups = await fleet({"url": SHARED_URL, "key_prefix": key_prefix}, ledger_url)
    load = Load(gws)
    load.start()
    before = 0.0
    for _ in range(10):  # what is queued in normal running
        await asyncio.sleep(0.1)
        before = max([before, *[await metric(gw, "tokenplane_ledger_buffered_writes") for gw in gws]])
    await asyncio.to_thread(private_pg.stop)
    await asyncio.sleep(OUTAGE_S)
    queued = [await metric(gw, "tokenplane_ledger_buffered_writes") for gw in gws]
    await asyncio.to_thread(private_pg.start)

    async def caught_up(band: float) -> bool:
        for gw in gws:
            if await metric(gw, "tokenplane_ledger_available") != 1.0:
                return False
            if await metric(gw, "tokenplane_ledger_buffered_writes") > band:
                return False
        return True

    # under load a few writes are always on their way (batched a moment after each answer): back
    # in band is the backlog written, what is queued no more than before the outage
    back_s = await within(RECOVERY_BAND_S, lambda: caught_up(max(before, QUEUED_BAND)))
    await load.stop()
    await within(RECOVERY_BAND_S, lambda: caught_up(0.0))
    dropped = [await metric(gw, "tokenplane_ledger_dropped_writes_total") for gw in gws]
    figures = check_ledger(ledger_url, load, ups)
    print(f"\nPostgreSQL down {OUTAGE_S} s: {figures}; queued at restart per replica {queued}; "
          f"written {back_s:.2f} s after restart")  # fmt: skip
    assert sum(queued) > 0  # writes did wait for the database
    assert dropped == [0.0, 0.0, 0.0]
    assert figures["refused"] == 0
