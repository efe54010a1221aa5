"""The Redis backend against a real Redis: limits shared by replicas, leases that heal, fail open."""

from __future__ import annotations

import asyncio

import pytest
import redis
from prometheus_client import CollectorRegistry
from redis_server import SHARED_URL, PrivateRedis

from tokenplane.gateway.config import StateConfig
from tokenplane.shared_state.quotas import QuotaReason, TenantQuota
from tokenplane.shared_state.redis_backend import RedisState

pytestmark = pytest.mark.anyio


def replica(url: str, prefix: str, **config: float) -> RedisState:
    return RedisState(StateConfig(backend="redis", url=url, key_prefix=prefix, **config), CollectorRegistry())


def up_metric(state: RedisState) -> float:
    return state.metrics.up._value.get()  # the gauge's own value (no HTTP here)


async def test_concurrency_is_global_and_released(key_prefix: str) -> None:
    a, b = replica(SHARED_URL, key_prefix), replica(SHARED_URL, key_prefix)
    await a.start()
    await b.start()
    try:
        quota = TenantQuota("acme", concurrency=2)
        assert (await a.acquire(quota, "", "a:1", 5)).admit
        assert (await b.acquire(quota, "", "b:1", 5)).admit
        third = await a.acquire(quota, "", "a:2", 5)
        assert not third.admit and third.reason is QuotaReason.CONCURRENCY and third.retry_after_s >= 1
        b.release(quota, "", "b:1", 3, shared=True)
        await asyncio.sleep(0.05)  # the release goes out with the loop's next iteration
        assert (await a.acquire(quota, "", "a:2", 5)).admit
    finally:
        await a.stop()
        await b.stop()


async def test_a_slot_freed_on_another_replica_is_found_by_a_request_already_sent(key_prefix: str) -> None:
    """A request's answer leaves before its release reaches Redis: a client resending at once
    through another replica can get there first. Here B's acquire is on the wire before A's
    release is written; B is still admitted (it asks once more, one round trip later)."""
    a, b = replica(SHARED_URL, key_prefix), replica(SHARED_URL, key_prefix)
    await a.start()
    await b.start()
    try:
        quota = TenantQuota("acme", concurrency=1)
        assert (await a.acquire(quota, "", "a:1", 5)).admit
        assert (await b.acquire(quota, "", "b:0", 5)).reason is QuotaReason.CONCURRENCY  # connected
        pending = asyncio.ensure_future(b.acquire(quota, "", "b:1", 5))
        await asyncio.sleep(0)  # B queues its acquire
        await asyncio.sleep(0)  # and writes it
        a.release(quota, "", "a:1", 3, shared=True)  # written with A's next loop iteration
        assert (await pending).admit
        assert not (await a.acquire(quota, "", "a:2", 5)).admit  # one slot: B holds it now
    finally:
        await a.stop()
        await b.stop()


async def test_rpm_and_tpm_are_shared_between_replicas(key_prefix: str) -> None:
    replicas = [replica(SHARED_URL, key_prefix) for _ in range(3)]
    for r in replicas:
        await r.start()
    try:
        rpm = TenantQuota("acme", rpm=7)
        results = await asyncio.gather(*(replicas[i % 3].acquire(rpm, "", f"m{i}", 1) for i in range(20)))
        assert sum(d.admit for d in results) == 7
        assert {d.reason for d in results if not d.admit} == {QuotaReason.TENANT_RPM}
        tpm = TenantQuota("beta", key_tpm=100)
        assert (await replicas[0].acquire(tpm, "key1", "x1", 40)).admit
        replicas[0].release(tpm, "key1", "x1", 70, shared=True)  # 110 used
        await asyncio.sleep(0.05)
        d = await replicas[1].acquire(tpm, "key1", "x2", 1)
        assert not d.admit and d.reason is QuotaReason.KEY_TPM
        assert (await replicas[1].acquire(tpm, "key2", "x3", 1)).admit  # another key
    finally:
        for r in replicas:
            await r.stop()


async def test_a_killed_replicas_slots_heal_within_the_lease(key_prefix: str) -> None:
    quota = TenantQuota("acme", concurrency=1)
    dead = replica(SHARED_URL, key_prefix, lease_ttl_s=0.6)
    await dead.start()
    assert (await dead.acquire(quota, "", "dead:1", 1)).admit
    # the replica dies without releasing: no renewals, no release
    for task in dead._tasks:
        task.cancel()
    dead.lean.close()
    await dead.client.aclose()
    alive = replica(SHARED_URL, key_prefix, lease_ttl_s=0.6)
    await alive.start()
    try:
        assert not (await alive.acquire(quota, "", "alive:1", 1)).admit
        await asyncio.sleep(0.7)
        assert (await alive.acquire(quota, "", "alive:1", 1)).admit
    finally:
        await alive.stop()


async def test_a_running_request_keeps_its_lease_past_the_ttl(key_prefix: str) -> None:
    quota = TenantQuota("acme", concurrency=1)
    a = replica(SHARED_URL, key_prefix, lease_ttl_s=0.3)
    await a.start()
    try:
        assert (await a.acquire(quota, "", "a:1", 1)).admit
        await asyncio.sleep(0.8)  # renewed every 0.1 s
        assert not (await a.acquire(quota, "", "a:2", 1)).admit
    finally:
        await a.stop()


async def test_fail_open_on_local_limits_then_converge(private_redis: PrivateRedis) -> None:
    a = replica(private_redis.url, "tp:", timeout_s=0.2, retry_connect_s=0.05)
    await a.start()
    try:
        quota = TenantQuota("acme", rpm=3)
        assert (await a.acquire(quota, "", "1", 1)).admit
        private_redis.kill()
        # Redis gone: decisions go on, on this replica's own buckets (the full limit, locally)
        local = [await a.acquire(quota, "", str(i), 1) for i in range(5)]
        assert [d.admit for d in local] == [True, True, True, False, False]
        assert not any(d.shared for d in local)
        assert up_metric(a) == 0
        assert a.metrics.fail_open.labels("acquire")._value.get() >= 1
        private_redis.start()  # an empty Redis on the same port
        for _ in range(100):
            if a.up:
                break
            await asyncio.sleep(0.05)
        assert a.up and up_metric(a) == 1
        d = await a.acquire(quota, "", "after", 1)
        assert d.admit and d.shared
        client = redis.Redis(port=private_redis.port)
        assert b"tp:rpm:acme" in client.keys("*")
        client.close()
    finally:
        await a.stop()


async def test_windowed_counters_add_up_across_replicas_and_fall_back_to_local(
    key_prefix: str,
) -> None:
    a = replica(SHARED_URL, key_prefix, sync_interval_s=0.02)
    b = replica(SHARED_URL, key_prefix, sync_interval_s=0.02)
    ca, cb = a.counters("retry", 10.0), b.counters("retry", 10.0)
    await a.start()
    await b.start()
    try:
        now = 100.0  # each replica's own clock: only its own entries are timed by it
        ca.add("retry:first", 3, now=now)
        cb.add("retry:first", 4, now=now)
        assert cb.get("retry:first", now=now) == 4  # its own at once
        for _ in range(100):
            if ca.get("retry:first", now=now) == 7 and cb.get("retry:first", now=now) == 7:
                break
            await asyncio.sleep(0.02)
        assert ca.get("retry:first", now=now) == 7 and cb.get("retry:first", now=now) == 7
        a.fail("test", OSError("pretend Redis went away"))
        assert ca.get("retry:first", now=now) == 3  # on its own numbers
        assert cb.get("retry:first", now=now + 11) == 3  # its own entries left its window, a's not yet
    finally:
        await a.stop()
        await b.stop()
