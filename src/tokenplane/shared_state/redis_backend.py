"""The ``redis`` state backend: what several gateway replicas must agree on, kept in one Redis.

What is shared, and how fresh each replica's view is:

* Tenant concurrency (``max_concurrency``, global across replicas) and the per-minute request and
  token limits (:mod:`~tokenplane.shared_state.quotas`): decided by one Lua script per request
  (:data:`~tokenplane.shared_state.scripts.ACQUIRE`), exact, no staleness. It is the request path's
  only round trip to Redis, on a pipelined connection of its own
  (:mod:`~tokenplane.shared_state.resp`); a request's end (lease freed, completion tokens charged)
  is written with the next command (within 2 ms) and Redis sends it no reply.
* Concurrency slots are leases (a sorted set scored by expiry), renewed every third of
  ``lease_ttl_s`` while their requests run: a replica killed with requests in flight frees its
  slots within ``lease_ttl_s`` (10 s by default), never leaking them.
* The retry budget's and the admission queue's windowed counters
  (:mod:`~tokenplane.shared_state.counters`): read from memory, synced every ``sync_interval_s``.
* The KV working set (:mod:`~tokenplane.shared_state.working_set`): read from memory, synced every
  ``sync_interval_s`` (one script call per model with a working-set limit).
* Each instance's in-flight work (:mod:`~tokenplane.shared_state.in_flight`, ``share_in_flight``):
  every ``sync_interval_s`` each replica writes a snapshot of its own (expiring) and reads the
  others' sums, which the instance views carry to the KV survival estimate.
* The response cache: entries stored in Redis (``SET`` with the model's ``ttl_s``, bodies up to
  ``cache_max_entry_bytes``) behind each replica's own cache; a local miss asks Redis (one
  pipelined ``GET``/``PTTL``, only for cacheable requests of a model that caches) and keeps what it
  finds locally for the rest of its TTL. Entries are exact answers that never change, so the only
  staleness is none: a local entry expires when the Redis entry does.
* Breaker transitions (milliseconds) and routing decisions for the approximate prefix index
  (batched every ``sync_interval_s``), by pub/sub: :mod:`~tokenplane.shared_state.peer_channel`.

Failure semantics: a Redis call that fails or takes longer than ``timeout_s`` marks the backend
down (``tokenplane_state_backend_up`` 0, one warning in the log, and
``tokenplane_state_fail_open_total{operation}`` per call that fell back). Requests then flow on
local state: each replica's own ``max_concurrency`` and its own per-minute buckets (so the fleet
may admit up to replicas × each limit). The replica pings Redis every ``retry_connect_s``; once it
answers, new requests use it again (``up`` 1, one log line). Requests admitted while it was down
hold no lease there and do not count against the shared concurrency limit until they end.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import Coroutine, Sequence
from typing import Any

import msgspec
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from tokenplane.gateway.config import StateConfig
from tokenplane.shared_state.counters import SyncedCounterStore
from tokenplane.shared_state.errors import BackendUnavailable
from tokenplane.shared_state.in_flight import SharedInFlight, ttl_s
from tokenplane.shared_state.peer_channel import PeerChannel
from tokenplane.shared_state.quotas import (
    ADMITTED,
    CHECK_ORDER,
    CONCURRENCY_RETRY_AFTER_S,
    LocalQuotas,
    QuotaDecision,
    TenantQuota,
)
from tokenplane.shared_state.resp import SEND_DELAY_S, RespConnection
from tokenplane.shared_state.scripts import ACQUIRE, IN_FLIGHT, RELEASE, RENEW, SYNC, WORKING_SET
from tokenplane.shared_state.state_metrics import StateMetrics
from tokenplane.shared_state.working_set import SharedWorkingSet

log = logging.getLogger(__name__)

MAX_ENCODED = 4096
STOP_TIMEOUT_S = 2.0
"""How long stopping waits for the background tasks and the client's close (a pub/sub connection
closed while its task is cancelled can otherwise hold a replica's shutdown indefinitely)."""
_FAILURES = (RedisError, OSError, TimeoutError, BackendUnavailable)
RETRY_FULL_AFTER_S = SEND_DELAY_S + 0.002
"""A concurrency refusal asks again after this (a release another replica sent may be on its way)."""


class RedisState:
    """One replica's link to the shared Redis (see the module docstring)."""

    def __init__(self, config: StateConfig, registry: CollectorRegistry) -> None:
        self.config = config
        self.replica_id = uuid.uuid4().hex[:12]
        self.prefix = config.key_prefix
        self.metrics = StateMetrics(registry)
        self.local = LocalQuotas(config.rate_window_s)
        self.up = True
        self.failures: tuple[type[BaseException], ...] = _FAILURES
        self.client = aioredis.Redis.from_url(
            config.url,
            socket_timeout=config.timeout_s,
            socket_connect_timeout=config.timeout_s,
            retry_on_timeout=False,
            # one immediate retry (a pooled connection Redis closed on restart), then fail open:
            # the client's default backs off for seconds, which the request path cannot wait
            retry=Retry(NoBackoff(), 1),
        )
        self.lean = RespConnection(config.url, config.timeout_s, scripts=(ACQUIRE, RELEASE))
        self._renew = self.client.register_script(RENEW)
        self._sync = self.client.register_script(SYNC)
        self._ws_sync = self.client.register_script(WORKING_SET)
        self._if_sync = self.client.register_script(IN_FLIGHT)
        self._in_flight: SharedInFlight | None = None
        self._counters: list[SyncedCounterStore] = []
        self._working_sets: list[SharedWorkingSet] = []
        self._leases: dict[str, str] = {}  # member -> lease set, for requests holding a slot
        self._encoded: dict[tuple[TenantQuota, str], tuple[bytes, bytes]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._reconnecting: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self.peers = PeerChannel(self)

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        try:
            await self.client.ping()
        except _FAILURES as exc:
            self.fail("start", exc)
        self._tasks = [
            asyncio.create_task(self._renew_loop()),
            asyncio.create_task(self.peers.listen()),
            asyncio.create_task(self._sync_loop()),
        ]

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._background]
        if self._reconnecting is not None:
            tasks.append(self._reconnecting)
        for task in tasks:
            task.cancel()
        if tasks:  # bounded: a pub/sub connection closing under cancellation must not hold the stop
            done, pending = await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
            for task in done:
                if not task.cancelled():
                    task.exception()  # retrieved: a failure at shutdown is not worth a warning
            if pending:
                log.warning(
                    "shared state: %d background tasks did not stop in %.0f s", len(pending), STOP_TIMEOUT_S
                )
        self._tasks = []
        self.lean.close()
        with contextlib.suppress(*_FAILURES):  # TimeoutError is among them
            await asyncio.wait_for(self.client.aclose(), STOP_TIMEOUT_S)

    # -- health ---------------------------------------------------------------------------------
    def fail(self, operation: str, exc: BaseException) -> None:
        """A Redis call failed: count it, and (once) fall back to local state until Redis answers."""
        self.metrics.fail_open.labels(operation).inc()
        if not self.up:
            return
        self.up = False
        self.lean.close()
        for store in self._counters:
            store.isolate()
        for ws in self._working_sets:
            ws.isolate()
        if self._in_flight is not None:
            self._in_flight.isolate()
        self.metrics.up.set(0)
        log.warning(
            "shared state: Redis at %s unavailable (%s: %s); running on local state until it answers",
            self.config.url,
            type(exc).__name__,
            exc,
        )
        if self._reconnecting is None or self._reconnecting.done():
            self._reconnecting = asyncio.create_task(self._reconnect())

    async def _reconnect(self) -> None:
        while not self.up:
            await asyncio.sleep(self.config.retry_connect_s)
            try:
                await self.client.ping()
            except _FAILURES:
                continue
            self.up = True
            self.metrics.up.set(1)
            log.warning("shared state: Redis at %s answers again; limits are shared again", self.config.url)

    # -- tenant limits --------------------------------------------------------------------------
    def _key(self, kind: str, name: str) -> str:
        return f"{self.prefix}{kind}:{name}"

    def _heads(self, quota: TenantQuota, key_id: str) -> tuple[bytes, bytes]:
        """The tenant's and key's acquire and release commands, encoded but for their last
        arguments (member, tokens)."""
        cached = self._encoded.get((quota, key_id))
        if cached is not None:
            return cached
        tenant = quota.tenant
        keys = [
            self._key("lease", tenant),
            self._key("rpm", tenant),
            self._key("tpm", tenant),
            self._key("krpm", key_id),
            self._key("ktpm", key_id),
        ]
        limits = (quota.concurrency, self.config.lease_ttl_s, quota.rpm, quota.tpm, quota.key_rpm)
        acquire = self.lean.prepare(ACQUIRE, keys, [*limits, quota.key_tpm, self.config.rate_window_s], 2)
        ends = [
            keys[0] if quota.concurrency else "",
            keys[2] if quota.tpm else "",
            keys[4] if quota.key_tpm else "",
        ]
        release = self.lean.prepare(RELEASE, ends, [self.config.rate_window_s], 2)
        if len(self._encoded) >= MAX_ENCODED:
            self._encoded.clear()
        cached = self._encoded[(quota, key_id)] = (acquire, release)
        return cached

    async def acquire(self, quota: TenantQuota, key_id: str, member: str, tokens: int) -> QuotaDecision:
        """Admit the request under its tenant's shared limits, or refuse with a reason."""
        if not self.up:
            self.metrics.fail_open.labels("acquire").inc()
            return self.local.acquire(quota, key_id, tokens, time.time())
        head = self._heads(quota, key_id)[0]
        more = (member.encode(), b"%d" % tokens)
        try:
            code, wait_ms = await self.lean.run(head, more)
            if code == 1:
                # Full: once more, a little later. A request that just ended on another replica
                # has had its answer sent before its release reached Redis (the release waits up
                # to SEND_DELAY_S to share a write), so a client resending at once could otherwise
                # find its own slot still taken. Only refusals pay for this.
                await asyncio.sleep(RETRY_FULL_AFTER_S)
                code, wait_ms = await self.lean.run(head, more)
        except _FAILURES as exc:
            self.fail("acquire", exc)
            return self.local.acquire(quota, key_id, tokens, time.time())
        if code == 0:
            if quota.concurrency:
                self._leases[member] = self._key("lease", quota.tenant)
            return ADMITTED
        reason = CHECK_ORDER[int(code) - 1]
        wait = CONCURRENCY_RETRY_AFTER_S if code == 1 else max(1.0, int(wait_ms) / 1000)
        return QuotaDecision(False, reason, wait)

    def release(self, quota: TenantQuota, key_id: str, member: str, tokens: int, *, shared: bool) -> None:
        """The request ended: free its lease and charge its completion tokens (written with the
        next commands, reply not awaited; if the connection is lost first, the lease expires on
        its own within ``lease_ttl_s``); ``shared`` False: it was admitted on local state."""
        if not shared:
            self.local.charge(quota, key_id, tokens, time.time())
            return
        held = self._leases.pop(member, None) is not None
        if not held and not ((quota.tpm or quota.key_tpm) and tokens > 0):
            return
        self.lean.send(self._heads(quota, key_id)[1], (member.encode(), b"%d" % tokens))

    async def _renew_loop(self) -> None:
        period = self.config.lease_ttl_s / 3
        while True:
            await asyncio.sleep(period)
            if not self._leases or not self.up:
                continue
            members = list(self._leases.items())
            try:
                await self._renew(
                    keys=[k for _, k in members], args=[self.config.lease_ttl_s, *[m for m, _ in members]]
                )
            except _FAILURES as exc:
                self.fail("renew", exc)

    # -- windowed counters (retry budget, admission fairness) ------------------------------------
    def counters(self, name: str, window_s: float) -> SyncedCounterStore:
        """A counter store shared with the other replicas, synced every ``sync_interval_s``."""
        store = SyncedCounterStore(name, window_s)
        self._counters.append(store)
        return store

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.sync_interval_s)
            if not self.up:
                continue
            for store in self._counters:
                if not store.touched:
                    continue  # idle here since the last sync: nothing to push, nobody to read
                store.touched = False
                keys, deltas = store.take_pending()
                if not keys:
                    continue
                base = f"{self.prefix}ctr:{store.name}:"
                try:
                    others = await self._sync(
                        keys=[base + k for k in keys], args=[self.replica_id, store.window_s, *deltas]
                    )
                except _FAILURES as exc:
                    self.fail("sync", exc)
                    break
                store.merge(keys, [float(x) for x in others])
            if self.up:
                await self._sync_working_sets()
            if self.up:
                await self._sync_in_flight()

    # -- the KV working set ---------------------------------------------------------------------
    def working_set(self, models: Sequence[str]) -> SharedWorkingSet:
        """The working set of ``models`` shared with the other replicas, synced every
        ``sync_interval_s``."""
        ws = SharedWorkingSet(models)
        self._working_sets.append(ws)
        return ws

    async def _sync_working_sets(self) -> None:
        for ws in self._working_sets:
            for model in ws.models:
                args = ws.take_pending(model)
                base = f"{self.prefix}ws:{model}"
                try:
                    flat = await self._ws_sync(keys=[base, base + ":seen"], args=[ws.idle_ttl_s, *args])
                except _FAILURES as exc:
                    self.fail("working_set", exc)
                    return
                ws.merge(model, flat)
            ws.synced()

    # -- each instance's in-flight work -----------------------------------------------------------
    def in_flight(self, shared: SharedInFlight) -> None:
        """Share this replica's in-flight work per instance, synced every ``sync_interval_s``."""
        self._in_flight = shared

    async def _sync_in_flight(self) -> None:
        shared = self._in_flight
        if shared is None:
            return
        base = f"{self.prefix}if:"
        args = [ttl_s(self.config.sync_interval_s), base, self.replica_id, *shared.take_own()]
        try:
            flat = await self._if_sync(keys=[self.prefix + "if", base + self.replica_id], args=args)
        except _FAILURES as exc:
            self.fail("in_flight", exc)
            return
        shared.merge(flat)

    # -- the response cache ---------------------------------------------------------------------
    def cache_key(self, parts: tuple[str, str, str, bytes]) -> str:
        """The Redis key of a response cache entry (tenant, model, endpoint, canonical body)."""
        digest = hashlib.sha256(msgspec.msgpack.encode(parts)).hexdigest()
        return f"{self.prefix}rc:{digest}"

    def fell_back(self, operation: str) -> None:
        """Count an operation done on local state only, Redis being unavailable."""
        self.metrics.fail_open.labels(operation).inc()

    async def cache_get(self, key: str) -> tuple[bytes, float] | None:
        """The stored body and its seconds left, or ``None`` (absent, or Redis unavailable)."""
        if not self.up:
            self.fell_back("cache_get")
            return None
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.get(key)
                pipe.pttl(key)
                body, pttl = await pipe.execute()
        except _FAILURES as exc:
            self.fail("cache_get", exc)
            return None
        if body is None or pttl is None or pttl <= 0:
            return None
        return bytes(body), pttl / 1000

    def cache_put(self, key: str, body: bytes, ttl_s: float) -> None:
        """Store an answer for ``ttl_s`` (off the request path; skipped above
        ``cache_max_entry_bytes`` or while Redis is unavailable)."""
        if not self.up or len(body) > self.config.cache_max_entry_bytes:
            return
        self.spawn(self._cache_put(key, body, max(1, int(ttl_s * 1000))))

    async def _cache_put(self, key: str, body: bytes, ttl_ms: int) -> None:
        try:
            await self.client.set(key, body, px=ttl_ms)
        except _FAILURES as exc:
            self.fail("cache_put", exc)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a Redis call off the request path (kept until done, cancelled by :meth:`stop`)."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
