"""The gateway's shared state, built from config, and its lifecycle (start, stop, housekeeping).

The stages (:mod:`~tokenplane.gateway.stages`) receive the parts of it they use; the admin routes
(:mod:`~tokenplane.gateway.admin`) read it; the composition root (:mod:`~tokenplane.gateway.app`)
builds it, the stages and the routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence

import aiohttp
from yarl import URL

from tokenplane.core.admission import DEFAULT_WINDOW_S as ADMISSION_WINDOW_S
from tokenplane.core.admission import AdmissionQueue
from tokenplane.core.breaker import BreakerState
from tokenplane.core.prompt_hash import ROUTING_BLOCK_TOKENS
from tokenplane.core.routing.prefix_index import PrefixIndex
from tokenplane.core.shedding import LoadShedder
from tokenplane.core.task_admission import KvWorkingSetLimit, fleet_kv_capacity_tokens
from tokenplane.gateway.admission import AdmissionMetrics, PoolAdmission
from tokenplane.gateway.catalog import ModelCatalog
from tokenplane.gateway.config import GatewayConfig, LimitsConfig
from tokenplane.gateway.deferral import DeferralRoom
from tokenplane.gateway.disagg.pools import DisaggregatedPools
from tokenplane.gateway.economics import CostModel, EconomicsMetrics
from tokenplane.gateway.fallback import FallbackChain, FallbackMetrics
from tokenplane.gateway.index_metrics import PrefixIndexCollector
from tokenplane.gateway.kv_events import KvEventsSubscriber, sources_from_instances
from tokenplane.gateway.metrics import GatewayMetrics
from tokenplane.gateway.path_metrics import PathMetrics
from tokenplane.gateway.resilience import Resilience
from tokenplane.gateway.response_cache import CacheMetrics, ResponseCache
from tokenplane.gateway.tenants import Authenticator
from tokenplane.gateway.tokenization.config import build_tokenizers
from tokenplane.gateway.tracing import Tracing
from tokenplane.gateway.transports.aiohttp_transport import AiohttpTransport
from tokenplane.gateway.transports.base import Transports, UpstreamReply
from tokenplane.gateway.transports.httptools_client import HttptoolsTransport, UpstreamClient
from tokenplane.gateway.upstreams import Upstream, UpstreamPool
from tokenplane.gateway.workflows import Workflows
from tokenplane.gateway.working_set import InMemoryWorkingSet, WorkingSetCollector, WorkingSetStore
from tokenplane.shared_state.in_flight import PeerLoad, SharedInFlight
from tokenplane.shared_state.redis_backend import RedisState
from tokenplane.shared_state.routing import SharedPrefixRouter, learn, prefix_index_of

log = logging.getLogger(__name__)

NO_INSTANCE_RETRY_AFTER_S = 1.0
HOUSEKEEPING_INTERVAL_S = 0.1
BOUND_INDEXES_EVERY = 50  # housekeeping rounds (5 s): an instance's KV cache size rarely changes
POOL_LIMIT_PER_HOST = 0  # unbounded: the instance's own queue is the bound, not the socket count


class _NotStarted:
    """The general transport before :meth:`Gateway.start`."""

    def post(
        self,
        upstream: Upstream,
        url: URL,
        body: bytes,
        extra_headers: Mapping[str, str] | None,
        first_byte_s: float | None,
    ) -> Awaitable[UpstreamReply]:
        raise RuntimeError("the gateway is not started")


class Gateway:
    """The state the stages share, built from config, and its lifecycle; one per application."""

    def __init__(self, config: GatewayConfig, *, rng: random.Random | None = None) -> None:
        self.limits: LimitsConfig = config.limits
        self.auth = Authenticator(config.tenants)
        self.tenant_configs = config.tenants
        self.rate_window_s = config.state.rate_window_s
        self.catalog = ModelCatalog(config.models, rng or random.Random())
        self.pool = UpstreamPool(config.instances, config.scrape, config.health, on_down=self._forget)
        self.metrics = GatewayMetrics(self.pool.all)
        self.path_metrics = PathMetrics(self.metrics.registry)
        self.disaggregated: DisaggregatedPools | None = DisaggregatedPools.from_models(
            [(m.name, m.pool) for m in config.models], self.metrics.registry, rng or random.Random()
        )
        self.economics = EconomicsMetrics(self.metrics.registry)
        served = {m.name: m.served_name for m in config.models}
        self.workflows = Workflows(
            config.ledger, CostModel(config.ledger, served), self.economics, self.metrics.registry
        )
        self.ledger_on = config.ledger.enabled
        self.tracing: Tracing | None = Tracing.from_config(config.tracing)  # None: each trace is NULL_TRACE
        shared = RedisState(config.state, self.metrics.registry) if config.state.backend == "redis" else None
        self.resilience = Resilience(
            config.retry,
            config.breaker,
            self.metrics.registry,
            lambda: (u.id for u in self.pool),
            budget_store=None if shared is None else shared.counters("retry", config.retry.window_s),
        )
        self.admission: dict[str, PoolAdmission] = {}
        adm_metrics = self.admission_metrics = AdmissionMetrics(self.metrics.registry, lambda: self.admission)
        self.ws_limits = {
            m.name: KvWorkingSetLimit(m.kv_working_set_fraction)
            for m in config.models
            if m.kv_working_set_fraction is not None
        }
        self.working_set: WorkingSetStore = (
            InMemoryWorkingSet() if shared is None else shared.working_set(list(self.ws_limits))
        )
        self.metrics.registry.register(PrefixIndexCollector(self._prefix_indexes))
        if self.ws_limits:
            self.metrics.registry.register(
                WorkingSetCollector(self.working_set, self._working_set_budgets, time.monotonic)
            )
        fair_window = float(config.admission.queue.get("window_s", ADMISSION_WINDOW_S))
        for m in self.catalog.models:
            self.admission[m.name] = PoolAdmission(
                m.name,
                AdmissionQueue.from_params(
                    config.admission.queue,
                    pool=m.name,
                    store=None if shared is None else shared.counters(f"admission:{m.name}", fair_window),
                ),
                LoadShedder.from_params(config.admission.shedding),
                self._capacity_of(m.name),
                adm_metrics,
                views=functools.partial(self.pool.views, m.name),
                ttft=self.pool.ttft(m.name),
            )
        self._avoid_move_delay(config)
        self._housekeeping: asyncio.Task[None] | None = None
        kv_sources = sources_from_instances(config.instances)
        self.kv_events: KvEventsSubscriber | None = KvEventsSubscriber(kv_sources) if kv_sources else None
        self.session: aiohttp.ClientSession | None = None
        self.tokenizers = build_tokenizers(config.models, config.instances, lambda: self.session)
        self.shared: RedisState | None = None
        self._shared_indexes: dict[str, PrefixIndex] = {}
        if shared is not None:
            self._share(shared)
        # the general transport is aiohttp's session, made at start (it needs a running loop)
        self.transports = Transports(_NotStarted(), None)

    def _avoid_move_delay(self, config: GatewayConfig) -> None:
        """Response caches, fallback chains and deferral rooms: each ``None`` when nothing uses it."""
        reg = self.metrics.registry
        cached = [m for m in config.models if m.response_cache is not None and m.response_cache.enabled]
        self.response_caches: dict[str, ResponseCache] | None = None
        if cached:
            cm = CacheMetrics(reg)
            self.response_caches = {
                m.name: ResponseCache(m.name, m.response_cache, cm) for m in cached if m.response_cache
            }
        self.fallbacks: dict[str, FallbackChain] | None = None
        if any(m.fallback for m in config.models):
            fm = FallbackMetrics(reg)
            adm = self.admission
            self.fallbacks = {
                m.name: FallbackChain(m.name, m.fallback, lambda name: adm[name].free(), fm)
                for m in config.models
                if m.fallback
            }
        self.defer_always = frozenset(t.name for t in config.tenants if t.priority == "deferrable")
        self.defer_allowed = self.defer_always | {t.name for t in config.tenants if t.allow_deferrable}
        self.deferral: dict[str, DeferralRoom] | None = None
        if self.defer_allowed:
            self.deferral = {m.name: DeferralRoom(self.admission[m.name], m.deferral) for m in config.models}

    def _share(self, shared: RedisState) -> None:
        """Several replicas: breaker transitions, routing decisions and (``share_in_flight``) the
        in-flight work per instance go to the others, and theirs come here
        (:mod:`tokenplane.shared_state.redis_backend`)."""
        self.shared = shared
        if shared.config.share_in_flight:
            shared.in_flight(SharedInFlight(self._own_in_flight, self._peer_in_flight))
        self.resilience.peers = shared.peers
        shared.peers.on_breaker = self._adopt_breaker
        for m in self.catalog.models:
            index = prefix_index_of(m.router)
            if index is not None:
                self._shared_indexes[m.name] = index
                m.router = SharedPrefixRouter(m.router, index, m.name, shared.peers)
        shared.peers.on_prefix = self._learn_routed

    def _own_in_flight(self) -> list[tuple[str, int, int]]:
        return [(u.id, u.in_flight, u.in_flight_tokens) for u in self.pool]

    def _peer_in_flight(self, peers: PeerLoad) -> None:
        for u in self.pool:
            u.set_peer_in_flight(*peers.get(u.id, (0, 0)))

    def _adopt_breaker(self, instance_id: str, state: str, cooldown_s: float) -> None:
        self.resilience.adopt(instance_id, state, cooldown_s, time.monotonic())

    def _learn_routed(self, model: str, instance_id: str, block_hashes: Sequence[int]) -> None:
        index = self._shared_indexes.get(model)
        if index is not None:
            learn(index, instance_id, block_hashes, time.monotonic())

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=self.limits.connect_timeout_s,
            sock_connect=self.limits.connect_timeout_s,
            sock_read=self.limits.upstream_timeout_s,
        )
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=POOL_LIMIT_PER_HOST, ttl_dns_cache=300)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
            # One session serves every tenant: cookies an instance sets must not travel to the next
            # caller's request (and an empty jar is still consulted per request).
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        client = UpstreamClient(
            connect_timeout_s=self.limits.connect_timeout_s, read_timeout_s=self.limits.upstream_timeout_s
        )
        self.transports.general = AiohttpTransport(self.session)
        self.transports.direct = HttptoolsTransport(client)
        await self.pool.start(self.session)
        if self.kv_events is not None:
            await self.kv_events.start()
        self._housekeeping = asyncio.create_task(self._housekeep())
        if self.shared is not None:
            await self.shared.start()
        if self.ledger_on:
            await self.workflows.start()

    async def stop(self) -> None:
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._housekeeping
            self._housekeeping = None
        if self.kv_events is not None:
            await self.kv_events.stop()
        if self.shared is not None:
            await self.shared.stop()
        await self.pool.stop()
        client = self.upstream_client
        if client is not None:
            await client.close()
        await self.workflows.stop()
        if self.tracing is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.tracing.shutdown)
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def _housekeep(self) -> None:
        """Materialise breaker cooldowns and dispatch queued requests capacity has come back for."""
        rounds = 0
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL_S)
            try:
                self.resilience.tick(time.monotonic())
                for pool in self.admission.values():
                    pool.pump()
                rounds += 1
                if rounds % BOUND_INDEXES_EVERY == 1:
                    self.bound_prefix_indexes()
            except Exception:  # the loop must outlive one bad round
                log.exception("housekeeping failed")

    def _prefix_indexes(self) -> Iterator[tuple[str, PrefixIndex, list[str]]]:
        for m in self.catalog.models:
            index = prefix_index_of(m.router)
            if index is not None:
                yield m.name, index, [u.id for u in self.pool.for_model(m.name)]

    def bound_prefix_indexes(self) -> None:
        """Each router's prefix index holds no more blocks for an instance than the instance's KV
        cache has (``kv_capacity_tokens``, configured or scraped, in the gateway's routing blocks:
        ``prompt_hash.ROUTING_BLOCK_TOKENS``); unknown: the index's own bound."""
        for m in self.catalog.models:
            index = prefix_index_of(m.router)
            if index is None:
                continue
            for u in self.pool.for_model(m.name):
                capacity = u.config.kv_capacity_tokens or u.metrics.kv_capacity_tokens
                if capacity > 0:
                    index.set_bound(u.id, -(-capacity // ROUTING_BLOCK_TOKENS))

    def _capacity_of(self, model: str) -> Callable[[], int]:
        """The pool's usable slots. While every breaker is closed it depends only on health,
        draining and membership, so it is cached against the pool's generation (read per request)."""
        board = self.resilience.board
        pool = self.pool
        generation = pool.generation
        cached = [-1, 0]  # [generation, capacity]

        def capacity() -> int:
            closed = board.all_closed
            if closed and cached[0] == generation.value:
                return cached[1]
            now = time.monotonic()
            value = sum(
                u.config.max_concurrency
                for u in pool.for_model(model)
                if u.healthy and not u.draining and (closed or board.allow(u.id, now=now))
            )
            if closed:
                cached[0], cached[1] = generation.value, value
            return value

        return capacity

    def _forget(self, upstream: Upstream) -> None:
        # An instance that went down may come back restarted with an empty cache.
        self.forget_instance(upstream.id, upstream.model)

    def forget_instance(self, instance_id: str, model: str | None = None) -> None:
        for m in self.catalog.models:
            if model is None or m.name == model:
                m.router.forget(instance_id)

    @property
    def upstream_client(self) -> UpstreamClient | None:
        """The hot-path client (``None`` before start); a benchmark may swap it for its own."""
        direct = self.transports.direct
        return direct.client if isinstance(direct, HttptoolsTransport) else None

    @upstream_client.setter
    def upstream_client(self, client: UpstreamClient) -> None:
        self.transports.direct = HttptoolsTransport(client)

    def retry_after(self, model: str, now: float) -> float:
        board = self.resilience.board
        if any(board.state(u.id, now=now) is BreakerState.OPEN for u in self.pool.for_model(model)):
            return max(NO_INSTANCE_RETRY_AFTER_S, board.config.cooldown_s)
        return NO_INSTANCE_RETRY_AFTER_S

    def kv_capacity(self, model: str) -> int:
        return fleet_kv_capacity_tokens(u.view() for u in self.pool.for_model(model))

    def _working_set_budgets(self) -> dict[str, int]:
        return {
            model: limit.budget_tokens(self.kv_capacity(model)) for model, limit in self.ws_limits.items()
        }
