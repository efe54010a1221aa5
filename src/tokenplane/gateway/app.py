"""The gateway's HTTP shell: an aiohttp application in front of the pool, deciding with the core.

One completion request goes through these stages, one method each, so that admission control,
retries, circuit breakers and stream continuation can be slotted in later without reshaping it:

1. :meth:`Gateway.authenticate`: ``Authorization: Bearer`` → tenant. Done before reading the body:
   it needs only a header, and an unauthenticated caller then costs (and learns) nothing more.
2. :meth:`Gateway.read_body`: at most ``limits.max_body_bytes`` (413 beyond).
3. :func:`~tokenplane.gateway.request.parse_request`: JSON, types, token limits (400).
4. :meth:`Gateway.resolve`: model name or alias → served model, if the tenant may use it (404).
5. :meth:`Tenant.acquire`: admission (today the tenant's concurrency bound, 429).
6. :meth:`Gateway.describe`: a :class:`~tokenplane.core.views.RequestInfo`, prompt hashed once.
7. :meth:`Gateway.route`: the model's router over the pool's views (503 when nothing is usable),
   then ``on_routed`` and the instance's in-flight accounting.
8. :meth:`Gateway.forward`: the body re-encoded with the upstream's model name, sent on the shared
   session; a JSON answer or an SSE relay (:mod:`~tokenplane.gateway.proxy`).
9. ``finally``: ``on_finished``, accounting released, one metrics record, whatever happened.

Errors are raised as :class:`~tokenplane.gateway.errors.GatewayError` anywhere and turned into
responses in :meth:`Gateway.completions` only, through :func:`~tokenplane.gateway.errors.error_response`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from tokenplane.core.admission import AdmissionQueue, PriorityClass
from tokenplane.core.breaker import BreakerState
from tokenplane.core.outcomes import AttemptOutcome, AttemptResult
from tokenplane.core.prompt_hash import block_hashes
from tokenplane.core.retry_budget import AttemptKind
from tokenplane.core.shedding import LoadShedder
from tokenplane.core.task_admission import KvWorkingSetLimit, fleet_kv_capacity_tokens
from tokenplane.core.views import InstanceId, RequestInfo, RouteDecision
from tokenplane.core.workflow_hints import WorkflowHints
from tokenplane.gateway.admission import PRIORITY_HEADER, AdmissionMetrics, PoolAdmission, priority_for
from tokenplane.gateway.catalog import ModelCatalog, ServedModel
from tokenplane.gateway.config import GatewayConfig, LimitsConfig
from tokenplane.gateway.continuation import StreamSplicer, can_continue, continuation_body
from tokenplane.gateway.deferral import DeferralRoom, wants_deferral
from tokenplane.gateway.economics import CostModel, EconomicsMetrics
from tokenplane.gateway.errors import (
    BodyTooLarge,
    DeadlineExceeded,
    GatewayError,
    KvWorkingSetFull,
    MethodNotAllowed,
    NoHealthyInstance,
    RouteNotFound,
    UpstreamError,
    UpstreamStalled,
    UpstreamTimeout,
    error_response,
)
from tokenplane.gateway.fallback import (
    SERVED_BY_HEADER,
    SERVED_BY_KEY,
    FallbackChain,
    FallbackMetrics,
    quality_of,
)
from tokenplane.gateway.fast_front import ANSWERED, AnyRequest, FastRequest
from tokenplane.gateway.kv_events import KvEventsSubscriber, sources_from_instances
from tokenplane.gateway.metrics import CONTENT_TYPE, GatewayMetrics
from tokenplane.gateway.path_metrics import PathMetrics
from tokenplane.gateway.proxy import (
    OUTCOME_CLIENT_GONE,
    OUTCOME_OK,
    OUTCOME_UPSTREAM_REJECTED,
    Exchange,
    open_upstream,
    read_json,
    rejection,
)
from tokenplane.gateway.request import ASSUMED_OUTPUT_TOKENS, Endpoint, ParsedRequest, parse_request
from tokenplane.gateway.resilience import Resilience
from tokenplane.gateway.response_cache import (
    CACHE_HEADER,
    CacheKey,
    CacheMetrics,
    ResponseCache,
    hit_response,
)
from tokenplane.gateway.tenants import Authenticator, Tenant
from tokenplane.gateway.tracing import Tracing
from tokenplane.gateway.upstream_client import UpstreamClient
from tokenplane.gateway.upstreams import Upstream, UpstreamPool
from tokenplane.gateway.workflows import AttemptLog, Workflows
from tokenplane.gateway.working_set import InMemoryWorkingSet, WorkingSetCollector, WorkingSetStore

log = logging.getLogger(__name__)

NO_INSTANCE_RETRY_AFTER_S = 1.0
HOUSEKEEPING_INTERVAL_S = 0.1
POOL_LIMIT_PER_HOST = 0  # unbounded: the instance's own queue is the bound, not the socket count

GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("tokenplane_gateway")

_encode = msgspec.json.Encoder().encode


class Gateway:
    """The request pipeline and the state it needs; one per application."""

    def __init__(self, config: GatewayConfig, *, rng: random.Random | None = None) -> None:
        self.limits: LimitsConfig = config.limits
        self.auth = Authenticator(config.tenants)
        self.catalog = ModelCatalog(config.models, rng or random.Random())
        self.pool = UpstreamPool(config.instances, config.scrape, config.health, on_down=self._forget)
        self.metrics = GatewayMetrics(self.pool.all)
        self.path_metrics = PathMetrics(self.metrics.registry)
        self.economics = EconomicsMetrics(self.metrics.registry)
        served = {m.name: m.served_name for m in config.models}
        self.workflows = Workflows(config.ledger, CostModel(config.ledger, served), self.economics)
        self._ledger_on = config.ledger.enabled
        self.tracing: Tracing | None = Tracing.from_config(config.tracing)
        self.resilience = Resilience(
            config.retry, config.breaker, self.metrics.registry, lambda: (u.id for u in self.pool)
        )
        self.admission: dict[str, PoolAdmission] = {}
        adm_metrics = self._adm_metrics = AdmissionMetrics(self.metrics.registry, lambda: self.admission)
        self.working_set: WorkingSetStore = InMemoryWorkingSet()
        self._ws_limits = {
            m.name: KvWorkingSetLimit(m.kv_working_set_fraction)
            for m in config.models
            if m.kv_working_set_fraction is not None
        }
        if self._ws_limits:
            self.metrics.registry.register(
                WorkingSetCollector(self.working_set, self._working_set_budgets, time.monotonic)
            )
        for m in self.catalog.models:
            self.admission[m.name] = PoolAdmission(
                m.name,
                AdmissionQueue.from_params(config.admission.queue, pool=m.name),
                LoadShedder.from_params(config.admission.shedding),
                self._capacity_of(m.name),
                adm_metrics,
            )
        self._avoid_move_delay(config)
        self._housekeeping: asyncio.Task[None] | None = None
        kv_sources = sources_from_instances(config.instances)
        self.kv_events: KvEventsSubscriber | None = KvEventsSubscriber(kv_sources) if kv_sources else None
        self.session: aiohttp.ClientSession | None = None
        self.upstream_client: UpstreamClient | None = None
        self._ids = itertools.count(1)
        self._id_prefix = f"tp-{os.getpid():x}-{int(time.time()):x}-"

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
        self._defer_always = frozenset(t.name for t in config.tenants if t.priority == "deferrable")
        self._defer_allowed = self._defer_always | {t.name for t in config.tenants if t.allow_deferrable}
        self.deferral: dict[str, DeferralRoom] | None = None
        if self._defer_allowed:
            self.deferral = {m.name: DeferralRoom(self.admission[m.name], m.deferral) for m in config.models}

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
        self.upstream_client = UpstreamClient(
            connect_timeout_s=self.limits.connect_timeout_s, read_timeout_s=self.limits.upstream_timeout_s
        )
        await self.pool.start(self.session)
        if self.kv_events is not None:
            await self.kv_events.start()
        self._housekeeping = asyncio.create_task(self._housekeep())
        if self._ledger_on:
            await self.workflows.start()

    async def stop(self) -> None:
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._housekeeping
            self._housekeeping = None
        if self.kv_events is not None:
            await self.kv_events.stop()
        await self.pool.stop()
        if self.upstream_client is not None:
            await self.upstream_client.close()
        await self.workflows.stop()
        if self.tracing is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.tracing.shutdown)
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def _housekeep(self) -> None:
        """Materialise breaker cooldowns and dispatch queued requests capacity has come back for."""
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL_S)
            try:
                self.resilience.tick(time.monotonic())
                for pool in self.admission.values():
                    pool.pump()
            except Exception:  # the loop must outlive one bad round
                log.exception("housekeeping failed")

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
            forget = getattr(m.router, "forget", None)
            if forget is not None and (model is None or m.name == model):
                forget(instance_id)

    # -- stages ---------------------------------------------------------------------------------
    def authenticate(self, request: AnyRequest) -> Tenant:
        return self.auth.authenticate(request.headers.get("Authorization"))

    async def read_body(self, request: AnyRequest) -> bytes:
        if type(request) is FastRequest:
            return request.body  # the front read it whole, within the limit
        assert isinstance(request, web.Request)
        limit = self.limits.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            raise BodyTooLarge(f"the request body is {length} bytes; the limit is {limit}")
        content = request.content
        if content.is_eof():  # the usual case: the whole body came with the headers
            data = content.read_nowait(-1)
            if len(data) > limit:
                raise BodyTooLarge(f"the request body is over the limit of {limit} bytes")
            return data
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise BodyTooLarge(f"the request body is over the limit of {limit} bytes") from None

    def resolve(self, parsed: ParsedRequest, tenant: Tenant) -> ServedModel:
        return self.catalog.resolve(parsed.model, tenant)

    def describe(
        self,
        parsed: ParsedRequest,
        model: ServedModel,
        tenant: Tenant,
        now: float,
        hints: WorkflowHints | None = None,
    ) -> RequestInfo:
        return RequestInfo(
            request_id=self._id_prefix + str(next(self._ids)),
            model=model.name,
            prompt_tokens=parsed.prompt_tokens,
            max_output_tokens=parsed.max_tokens or ASSUMED_OUTPUT_TOKENS,
            block_hashes=block_hashes(parsed.prompt_text),
            tenant=tenant.name,
            priority=tenant.priority if hints is None else hints.priority,
            arrival_s=now,
            workflow=None if hints is None else hints.workflow,
            cached_prefix_tokens=self._cached_prefix(parsed),
        )

    def _cached_prefix(self, parsed: ParsedRequest) -> dict[str, int] | None:
        """Precise mode: exact cached tokens per instance from vLLM's KV events, where the request
        carries token ids and some instance publishes events; else ``None`` (approximate index)."""
        if self.kv_events is None or parsed.token_ids is None:
            return None
        return self.kv_events.index.match_tokens(parsed.token_ids)

    def route(
        self,
        info: RequestInfo,
        model: ServedModel,
        now: float,
        exclude: frozenset[InstanceId] = frozenset(),
    ) -> tuple[Upstream, RouteDecision]:
        views = self.resilience.candidates([u.view() for u in self.pool.for_model(model.name)], exclude, now)
        decision = model.router.select(info, views, now=now) if views else None
        iid = decision.instance_id if decision is not None else None
        upstream = self.pool.get(iid) if iid is not None else None
        if upstream is None or decision is None:
            raise NoHealthyInstance(
                f"no healthy instance serves {model.name!r} right now",
                retry_after_s=self._retry_after(model.name, now),
            )
        return upstream, decision

    def _retry_after(self, model: str, now: float) -> float:
        board = self.resilience.board
        if any(board.state(u.id, now=now) is BreakerState.OPEN for u in self.pool.for_model(model)):
            return max(NO_INSTANCE_RETRY_AFTER_S, board.config.cooldown_s)
        return NO_INSTANCE_RETRY_AFTER_S

    async def attempt(
        self,
        request: AnyRequest,
        parsed: ParsedRequest,
        body: bytes,
        model: ServedModel,
        upstream: Upstream,
        ex: Exchange,
        splicer: StreamSplicer | None,
        first_byte_s: float | None,
        headers: dict[str, str] | None = None,
        by_budget: bool = False,
    ) -> tuple[AttemptOutcome, web.StreamResponse | None, GatewayError | None]:
        """One attempt on one instance: (its outcome, the client response if it produced one, its error).

        The breaker hears of every attempt that started, whatever happened (a probe slot is never
        leaked); the instance's accounting and the router's in-flight view are released in ``finally``.
        ``by_budget``: ``first_byte_s`` is what is left of the request's latency budget, so running
        out of it is the request's miss; the instance is not judged by it (a busy instance taken
        out for its callers' short budgets would push their load onto the rest: the cascade).
        """
        info = ex.info
        assert info is not None
        started = time.monotonic()
        tokens = info.prompt_tokens + info.max_output_tokens
        model.router.on_routed(info, upstream.id, now=started)
        upstream.begin(tokens)
        ex.upstream = upstream
        self.resilience.on_attempt(upstream.id, started)
        result = AttemptResult.FAILED_BEFORE_FIRST_BYTE
        delivered = 0
        latency: float | None = None
        resp = None
        clean = False
        abandoned = False  # the client left before the instance answered
        try:
            url = upstream.chat_url if parsed.endpoint == "chat" else upstream.completions_url
            try:
                session = self.session
                assert session is not None, "the gateway is not started"
                resp = await open_upstream(
                    session, upstream, url, body, headers, self.upstream_client, first_byte_s=first_byte_s
                )
                upstream.heard_at = time.monotonic()
                if resp.status != 200:
                    out = await rejection(resp, upstream)  # raises for 5xx and non-OpenAI 4xx
                    ex.outcome = OUTCOME_UPSTREAM_REJECTED
                    result = AttemptResult.OK  # the instance works; the request was refused
                    return self._outcome(result, upstream, 0, None), out, None
                if splicer is None:
                    data = await read_json(resp, ex, upstream)
                    clean = True
                    result = AttemptResult.OK
                    upstream.record_success()
                    latency = time.monotonic() - started
                    out = await _send_json(request, data, ex)
                    return self._outcome(result, upstream, 0, latency), out, None
            except UpstreamError as exc:
                if by_budget and isinstance(exc, UpstreamTimeout):
                    abandoned = True
                    miss = DeadlineExceeded(f"no answer from {upstream.id} within the latency budget")
                    return self._outcome(result, upstream, 0, None), None, miss
                if isinstance(exc, UpstreamTimeout):
                    result = AttemptResult.TIMEOUT
                    if upstream.answered_since(started):  # it answered others meanwhile
                        return self._outcome(result, upstream, 0, None), None, exc
                self.pool.record_failure(upstream, exc.message)
                return self._outcome(result, upstream, 0, None), None, exc
            except GatewayError:  # an instance's 4xx that is not an OpenAI error: the caller's fault
                result = AttemptResult.OK
                raise
            except BaseException:  # cancelled: the client left; an answering instance is not at fault
                if resp is not None and resp.status == 200:
                    result = AttemptResult.OK
                else:
                    abandoned = True
                raise
            end = await splicer.relay(resp, ex, upstream)
            delivered = end.tokens
            latency = end.latency_s
            if end.failure is not None:
                result = AttemptResult.FAILED_MID_STREAM
                failure = end.failure
                if not (isinstance(failure, UpstreamStalled) and failure.busy):  # else: busy, not down
                    self.pool.record_failure(upstream, failure.message)
                return self._outcome(result, upstream, delivered, latency), splicer.out, end.failure
            result = AttemptResult.OK
            if not end.client_gone:
                clean = True
                upstream.record_success()
            return self._outcome(result, upstream, delivered, latency), splicer.out, None
        finally:
            if abandoned:
                self.resilience.on_abandoned(upstream.id)
            else:
                self.resilience.on_outcome(
                    AttemptOutcome(result, upstream.id, delivered, time.monotonic(), latency)
                )
            if resp is not None:
                if clean:
                    resp.release()
                else:
                    resp.close()  # closes the connection: the instance sees the client go and aborts
            upstream.end(tokens)
            model.router.on_finished(info, upstream.id, now=time.monotonic())

    async def accounted_attempt(
        self,
        request: AnyRequest,
        parsed: ParsedRequest,
        body: bytes,
        model: ServedModel,
        upstream: Upstream,
        ex: Exchange,
        splicer: StreamSplicer | None,
        first_byte_s: float | None,
        kind: AttemptKind,
        number: int,
        by_budget: bool = False,
    ) -> tuple[AttemptOutcome, web.StreamResponse | None, GatewayError | None]:
        """:meth:`attempt`, with its span, its upstream-duration metrics and its ledger record."""
        info = ex.info
        assert info is not None
        trace = ex.trace
        base = splicer.delivered_tokens if splicer is not None else 0
        tokens_in = info.prompt_tokens + base
        span = None
        headers = None
        if trace is not None:
            name = "tokenplane.continuation" if kind is AttemptKind.CONTINUATION else "tokenplane.upstream"
            span = trace.start(
                name,
                client=True,
                tokenplane__instance=upstream.id,
                tokenplane__attempt__number=number,
                tokenplane__attempt__kind=kind.value,
                tokenplane__tokens__prompt=tokens_in,
            )
            headers = trace.headers(span)
        started = time.monotonic()
        outcome: AttemptOutcome | None = None
        out: web.StreamResponse | None = None
        error: GatewayError | None = None
        reason = OUTCOME_CLIENT_GONE
        try:
            outcome, out, error = await self.attempt(
                request, parsed, body, model, upstream, ex, splicer, first_byte_s, headers, by_budget
            )
            return outcome, out, error
        except GatewayError as exc:
            reason = exc.outcome
            raise
        finally:
            duration = time.monotonic() - started
            ok = outcome is not None and error is None and out is not None and ex.outcome == OUTCOME_OK
            if outcome is not None:
                reason = error.outcome if error is not None else ex.outcome
            if splicer is not None:
                delivered = max(0, splicer.delivered_tokens - base)
                tokens_out = outcome.tokens_delivered if outcome is not None else delivered
                first = outcome.latency_s if outcome is not None else None
            else:
                tokens_out = ex.completion_tokens if ok else 0
                first = None
            self.path_metrics.attempt(model.name, upstream.id, duration, tokens_out, first)
            cost = 0.0
            if ex.ledger is not None:
                cost = ex.ledger.done(info, upstream.config, tokens_in, tokens_out, ok, reason)
            if trace is not None and span is not None:
                trace.end(
                    span,
                    error=None if ok else reason,
                    tokenplane__attempt__result=outcome.result.value if outcome is not None else reason,
                    tokenplane__tokens__output=tokens_out,
                    tokenplane__cost_usd=cost,
                )

    @staticmethod
    def _outcome(
        result: AttemptResult, upstream: Upstream, delivered: int, latency: float | None
    ) -> AttemptOutcome:
        return AttemptOutcome(result, upstream.id, delivered, time.monotonic(), latency)

    async def forward(
        self,
        request: AnyRequest,
        parsed: ParsedRequest,
        model: ServedModel,
        tenant: Tenant,
        ex: Exchange,
        deadline_s: float,
    ) -> web.StreamResponse:
        """Drive the core retry plan: attempts on instances the breakers allow, spliced into one answer."""
        info = ex.info
        assert info is not None
        body = parsed.body
        body["model"] = model.served_name
        # Re-encoded, never the client's bytes as they came: what the instance reads is then what
        # was validated here (a body with a key twice means one thing to msgspec, last wins, and
        # maybe another to a runtime's parser; max_tokens checked here could be bypassed).
        raw = _encode(body)
        res = self.resilience
        splicer = (
            StreamSplicer(request, parsed.endpoint == "chat", res.retry.stream_idle_timeout_s)
            if parsed.stream
            else None
        )
        now = time.monotonic()
        # A stream's deadline for continuations is its whole life: the admission deadline is a
        # time-to-first-token budget, which bounds retries only while nothing was delivered.
        life = ex.arrival + self.limits.upstream_timeout_s
        plan = res.plan(
            info,
            now=now,
            deadline_s=max(deadline_s, life) if parsed.stream else deadline_s,
            allow_continuation=tenant.continuation and can_continue(parsed),
        )
        attempt = next(plan)
        error: GatewayError | None = None
        first_byte_cap = res.retry.first_byte_timeout_s
        try:
            while True:
                if attempt.number > 1:
                    res.count_attempt(model.name, attempt.kind is AttemptKind.CONTINUATION)
                    if attempt.delay_s > 0:
                        await asyncio.sleep(attempt.delay_s)
                    if splicer is not None:
                        splicer.digest()
                        raw = _encode(continuation_body(parsed, splicer.text, splicer.delivered_tokens))
                now = time.monotonic()
                ttft_left = deadline_s - now if (splicer is None or not splicer.delivered_tokens) else None
                if ttft_left is not None and ttft_left <= 0 and error is not None:
                    break  # nothing delivered and the latency budget is spent: no retry
                trace = ex.trace
                rspan = trace.start("tokenplane.route") if trace is not None else None
                try:
                    upstream, decision = self.route(info, model, now, attempt.exclude)
                except NoHealthyInstance as exc:
                    if trace is not None and rspan is not None:
                        trace.end(rspan, error=exc.message)
                    if error is None:
                        error = exc
                    break
                ex.reason = decision.reason.value
                if trace is not None and rspan is not None:
                    trace.end(rspan, tokenplane__instance=upstream.id, tokenplane__route__reason=ex.reason)
                # The latency budget is a time-to-first-token budget. A stream's headers come at
                # once, so it bounds their wait; a plain answer's headers come with its last token,
                # so there the budget bounds only the queue and retries, not a long generation.
                cap, by_budget = first_byte_cap, False
                if ttft_left is not None and splicer is not None and (cap is None or ttft_left < cap):
                    cap, by_budget = ttft_left, True
                outcome, out, error = await self.accounted_attempt(
                    request, parsed, raw, model, upstream, ex, splicer, cap, attempt.kind, attempt.number,
                    by_budget,
                )  # fmt: skip
                if error is None and out is not None:
                    plan.close()
                    return out
                if (
                    splicer is not None
                    and splicer.started
                    and parsed.max_tokens is not None
                    and splicer.delivered_tokens >= parsed.max_tokens
                ):
                    await splicer.end_length()  # all asked for was sent; only the end was lost
                    assert splicer.out is not None
                    return splicer.out
                try:
                    attempt = plan.send(outcome)
                except StopIteration:
                    break
        finally:
            plan.close()
        assert error is not None
        if splicer is not None and splicer.started:
            ex.outcome = error.outcome
            return await splicer.fail(error)
        raise error

    # -- handlers -------------------------------------------------------------------------------
    async def completions(self, request: AnyRequest, endpoint: Endpoint) -> web.StreamResponse:
        now = time.monotonic()
        ex = Exchange(now)
        model: ServedModel | None = None
        tenant: Tenant | None = None
        acquired = False
        pool: PoolAdmission | None = None
        info: RequestInfo | None = None
        tracing = self.tracing
        tr = None if tracing is None else tracing.begin(request.headers, request.method, request.path)
        ex.trace = tr
        try:
            span = tr.start("tokenplane.authenticate") if tr is not None else None
            tenant = self.authenticate(request)
            ex.tenant = tenant.name
            if tr is not None and span is not None:
                tr.end(span, tokenplane__tenant=tenant.name)
            parsed = parse_request(await self.read_body(request), endpoint, self.limits)
            ex.stream = parsed.stream
            model = self.resolve(parsed, tenant)
            ex.model = model.name
            cache_key: CacheKey | None = None
            caches = self.response_caches
            if caches is not None and (cache := caches.get(model.name)) is not None:
                key = cache.key(tenant.name, endpoint, parsed.body)
                if key is not None:
                    stored = cache.get(key)
                    if stored is not None:
                        ex.reason = "cache"
                        return hit_response(stored, parsed.body, parsed.stream)
                    cache_key = None if parsed.stream else key
            hints = self.workflows.hints(request.headers, parsed.body, tenant, now)
            if self.fallbacks is not None and (chain := self.fallbacks.get(model.name)) is not None:
                moved = chain.choose(quality_of(request.headers, parsed.body), tenant.may_use)
                if moved is not None:
                    model = self.catalog.resolve(moved[0], tenant)
                    ex.model = model.name
                    request[SERVED_BY_KEY] = model.name
                    cache_key = None  # only the requested model's own answers are stored
            tenant.acquire()
            acquired = True
            info = ex.info = self.describe(parsed, model, tenant, now, hints)
            if self._ws_limits and info.workflow is not None:
                self._check_working_set(model.name, info, now)
            if self._ledger_on:
                ex.ledger = AttemptLog(self.workflows)
            if tr is not None:
                wf = info.workflow
                tr.set(
                    tokenplane__tenant=tenant.name,
                    tokenplane__model=model.name,
                    tokenplane__stream=parsed.stream,
                    tokenplane__request_id=info.request_id,
                    tokenplane__workflow__id=wf.workflow_id if wf is not None else None,
                    tokenplane__workflow__step=wf.step if wf is not None else None,
                    tokenplane__tokens__prompt=info.prompt_tokens,
                )
            pool = self.admission[model.name]
            capacity = pool.capacity()
            if capacity <= 0:
                raise NoHealthyInstance(
                    f"no healthy instance serves {model.name!r} right now",
                    retry_after_s=self._retry_after(model.name, now),
                )
            if hints is not None and hints.requested_priority is not None:
                priority = PriorityClass.from_value(hints.priority)
            else:
                header = request.headers.get(PRIORITY_HEADER)
                priority = priority_for(tenant.priority, header, tenant.allow_priority_raise)
            aspan = None
            if tr is not None:
                aspan = tr.start("tokenplane.admission", tokenplane__priority=priority.label)
            admit_s = time.monotonic()
            deferred = False
            if (
                self.deferral is not None
                and tenant.name in self._defer_allowed
                and (tenant.name in self._defer_always or wants_deferral(request.headers))
            ):
                wf = info.workflow
                await self.deferral[model.name].wait(now, wf.deadline_s if wf is not None else None)
                priority = PriorityClass.BATCH
                deferred = True  # the capacity read above may have changed while it waited
            deadline = await pool.admit(info, priority, now, None if deferred else capacity)
            if tr is not None and aspan is not None:
                tr.end(aspan, tokenplane__queue_wait_s=time.monotonic() - admit_s)
            try:
                ex.cacheable = cache_key is not None
                out = await self.forward(request, parsed, model, tenant, ex, deadline)
                if cache_key is not None:
                    self._store(cache_key, out, ex)
                return out
            finally:
                pool.release(info)
                if self.deferral is not None:
                    self.deferral[model.name].notify()
        except GatewayError as exc:
            ex.outcome = exc.outcome
            if tr is not None:
                tr.set(http__response__status_code=exc.status)
            return error_response(exc)
        except BaseException as other:
            if not isinstance(other, Exception):  # cancelled: the client went away
                ex.outcome = OUTCOME_CLIENT_GONE
                raise
            log.exception("unexpected error in the request path")
            ex.outcome = "internal_error"
            return error_response(GatewayError("internal error in the gateway", code="internal_error"))
        finally:
            if acquired and tenant is not None:
                tenant.release()
            if ex.ttft_s is not None:
                self.metrics.first_token(ex.model, ex.ttft_s)
            elapsed = time.monotonic() - now
            self.metrics.request_done(ex.model, ex.tenant, ex.outcome, ex.reason, elapsed, ex.stream)
            if ex.outcome == OUTCOME_OK:
                self.path_metrics.request(ex.model, ex.tenant, elapsed)
            if ex.ledger is not None:
                ex.ledger.finish(failed=ex.outcome not in (OUTCOME_OK, OUTCOME_CLIENT_GONE))
            if info is not None and (wf := info.workflow) is not None and ex.model in self._ws_limits:
                last = wf.total_steps is not None and wf.step >= wf.total_steps
                if ex.outcome != OUTCOME_OK or last:  # the task ended or this step failed
                    self.working_set.drop(ex.model, info.tenant, wf.workflow_id)
            if tr is not None:
                tr.finish(ex.outcome)

    def _kv_capacity(self, model: str) -> int:
        return fleet_kv_capacity_tokens(u.view() for u in self.pool.for_model(model))

    def _working_set_budgets(self) -> dict[str, int]:
        return {
            model: limit.budget_tokens(self._kv_capacity(model)) for model, limit in self._ws_limits.items()
        }

    def _check_working_set(self, model: str, info: RequestInfo, now: float) -> None:
        """The core's KV working-set limit: a new task waits while the tasks in progress fill the
        pool's KV cache; an admitted step (re)enters the working set with its projected peak."""
        limit = self._ws_limits.get(model)
        if limit is None:
            return
        ws = self.working_set
        decision = limit.decide(
            info,
            active_context_tokens=ws.total(model, now),
            kv_capacity_tokens=self._kv_capacity(model),
            growth_per_step_tokens=ws.growth(model),
        )
        if not decision.admit:
            self._adm_metrics.rejected.labels(decision.reason.value).inc()
            raise KvWorkingSetFull(
                f"{model!r} is busy with tasks in progress ({decision.working_set_tokens} of "
                f"{decision.budget_tokens} KV tokens); start this task later",
                retry_after_s=self._retry_after(model, now),
            )
        ws.observe(model, info, limit, now)

    def _store(self, key: CacheKey, out: web.StreamResponse, ex: Exchange) -> None:
        """Keep a successful JSON answer of the requested model (never an error, never a stream)."""
        assert self.response_caches is not None
        if ex.outcome == OUTCOME_OK and isinstance(out, web.Response) and out.status == 200:
            body = out.body
            if isinstance(body, bytes):
                self.response_caches[key[1]].put(key, body)

    async def models(self, request: web.Request) -> web.Response:
        try:
            tenant = self.authenticate(request)
        except GatewayError as exc:
            return error_response(exc)
        return web.Response(body=self.catalog.listing(tenant), content_type="application/json")

    async def health(self, request: web.Request) -> web.Response:
        ups = self.pool.all()
        healthy = sum(1 for u in ups if u.healthy)
        body = {"status": "ok", "instances": len(ups), "healthy_instances": healthy}
        return web.Response(body=_encode(body), content_type="application/json")

    async def prometheus(self, request: web.Request) -> web.Response:
        await self.workflows.refresh()
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def workflow(self, request: web.Request) -> web.Response:
        try:
            tenant = self.authenticate(request)
            return await self.workflows.show(request.match_info["workflow_id"], tenant)
        except GatewayError as exc:
            return error_response(exc)

    async def workflow_outcome(self, request: web.Request) -> web.Response:
        try:
            tenant = self.authenticate(request)
            raw = await self.read_body(request)
            workflow_id = request.match_info["workflow_id"]
            out = await self.workflows.set_outcome(workflow_id, tenant, raw)
            if out.status == 200:
                for model in self._ws_limits:
                    self.working_set.drop(model, tenant.name, workflow_id)
            return out
        except GatewayError as exc:
            return error_response(exc)

    async def instances(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        data = []
        for u in self.pool.all():
            d = u.describe()
            d["breaker"] = self.resilience.state(u.id, now).value
            data.append(d)
        body = {"object": "list", "data": data}
        return web.Response(body=_encode(body), content_type="application/json")

    async def not_found(self, request: web.Request) -> web.Response:
        known = {r.resource.canonical for r in request.app.router.routes() if r.resource is not None}
        if request.path in known:
            return error_response(MethodNotAllowed(f"{request.method} is not allowed on {request.path}"))
        return error_response(RouteNotFound(f"no route {request.method} {request.path}"))


def create_app(config: GatewayConfig, *, rng: random.Random | None = None) -> web.Application:
    """The gateway as an aiohttp application; its session and pool start and stop with the app."""
    gw = Gateway(config, rng=rng)
    app = web.Application(client_max_size=config.limits.max_body_bytes)
    app[GATEWAY_KEY] = gw

    loops: list[Any] = []

    async def on_startup(_: web.Application) -> None:
        await gw.start()
        if config.autoscaling is not None and config.autoscaling.enabled:
            from tokenplane.gateway.autoscaling import build_control_loop

            loop = build_control_loop(gw, config.autoscaling)
            loop.start()
            loops.append(loop)

    async def on_cleanup(_: web.Application) -> None:
        for loop in loops:
            await loop.stop(stop_instances=True)
        await gw.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    if gw.fallbacks is not None:
        app.on_response_prepare.append(_served_by)
    routes: list[tuple[str, str, Callable[[web.Request], Awaitable[Any]]]] = [
        # partials, not wrapper coroutines: one frame fewer for a stream's every chunk to resume
        ("POST", "/v1/chat/completions", functools.partial(gw.completions, endpoint="chat")),
        ("POST", "/v1/completions", functools.partial(gw.completions, endpoint="completions")),
        ("GET", "/v1/models", gw.models),
        ("GET", "/v1/instances", gw.instances),
        ("GET", "/health", gw.health),
        ("GET", "/metrics", gw.prometheus),
        ("GET", "/v1/workflows/{workflow_id}", gw.workflow),
        ("POST", "/v1/workflows/{workflow_id}/outcome", gw.workflow_outcome),
    ]
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    app.router.add_route("*", "/{tail:.*}", gw.not_found)
    return app


async def _send_json(request: AnyRequest, data: bytes, ex: Exchange) -> web.Response:
    """Send an instance's JSON answer at once (see :func:`_send_now`); the fast front writes it
    with no ``web.Response`` made (unless the response cache is to keep it), and the handler
    returns :data:`~tokenplane.gateway.fast_front.ANSWERED`."""
    if type(request) is FastRequest and not ex.cacheable:
        if not request.send_json(data):
            ex.outcome = OUTCOME_CLIENT_GONE
        return ANSWERED
    out = web.Response(body=data, content_type="application/json")
    await _send_now(request, out, ex)
    return out


async def _send_now(request: AnyRequest, out: web.Response, ex: Exchange) -> None:
    """Write a complete answer before the bookkeeping that follows it (breakers, ledger, metrics,
    admission release), so none of that is on the client's latency; the handler then returns a
    response that is already sent, which aiohttp leaves as it is."""
    if ex.cacheable:
        out.headers[CACHE_HEADER] = "miss"  # stored by the handler once it is sent
    if type(request) is FastRequest:
        if not request.send(out):
            ex.outcome = OUTCOME_CLIENT_GONE
        return
    assert isinstance(request, web.Request)
    try:
        await out.prepare(request)
        await out.write_eof()
    except ConnectionResetError:
        ex.outcome = OUTCOME_CLIENT_GONE


async def _served_by(request: web.Request, response: web.StreamResponse) -> None:
    """Name the model that served a request moved down its fallback chain."""
    served = request.get(SERVED_BY_KEY)
    if served is not None:
        response.headers[SERVED_BY_HEADER] = served
