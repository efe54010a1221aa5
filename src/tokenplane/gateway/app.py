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

from tokenplane.core.views import RequestInfo, RouteDecision
from tokenplane.gateway.catalog import ModelCatalog, ServedModel
from tokenplane.gateway.config import GatewayConfig, LimitsConfig
from tokenplane.gateway.errors import (
    BodyTooLarge,
    GatewayError,
    MethodNotAllowed,
    NoHealthyInstance,
    RouteNotFound,
    UpstreamError,
    error_response,
)
from tokenplane.gateway.hashing import BlockHasher
from tokenplane.gateway.metrics import CONTENT_TYPE, GatewayMetrics
from tokenplane.gateway.proxy import (
    OUTCOME_CLIENT_GONE,
    OUTCOME_OK,
    OUTCOME_UPSTREAM_REJECTED,
    Exchange,
    open_upstream,
    rejection,
    relay_json,
    relay_stream,
)
from tokenplane.gateway.request import ASSUMED_OUTPUT_TOKENS, Endpoint, ParsedRequest, parse_request
from tokenplane.gateway.tenants import Authenticator, Tenant
from tokenplane.gateway.upstreams import Upstream, UpstreamPool

log = logging.getLogger(__name__)

NO_INSTANCE_RETRY_AFTER_S = 1.0
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
        self.hasher = BlockHasher()
        self.session: aiohttp.ClientSession | None = None
        self._ids = itertools.count(1)
        self._id_prefix = f"tp-{os.getpid():x}-{int(time.time()):x}-"

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
        await self.pool.start(self.session)

    async def stop(self) -> None:
        await self.pool.stop()
        if self.session is not None:
            await self.session.close()
            self.session = None

    def _forget(self, upstream: Upstream) -> None:
        # An instance that went down may come back restarted with an empty cache.
        for m in self.catalog.models:
            forget = getattr(m.router, "forget", None)
            if forget is not None and m.name == upstream.model:
                forget(upstream.id)

    # -- stages ---------------------------------------------------------------------------------
    def authenticate(self, request: web.Request) -> Tenant:
        return self.auth.authenticate(request.headers.get("Authorization"))

    async def read_body(self, request: web.Request) -> bytes:
        limit = self.limits.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            raise BodyTooLarge(f"the request body is {length} bytes; the limit is {limit}")
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise BodyTooLarge(f"the request body is over the limit of {limit} bytes") from None

    def resolve(self, parsed: ParsedRequest, tenant: Tenant) -> ServedModel:
        return self.catalog.resolve(parsed.model, tenant)

    def describe(self, parsed: ParsedRequest, model: ServedModel, tenant: Tenant, now: float) -> RequestInfo:
        return RequestInfo(
            request_id=self._id_prefix + str(next(self._ids)),
            model=model.name,
            prompt_tokens=parsed.prompt_tokens,
            max_output_tokens=parsed.max_tokens or ASSUMED_OUTPUT_TOKENS,
            block_hashes=self.hasher.hashes(parsed.prompt_text),
            tenant=tenant.name,
            priority=tenant.priority,
            arrival_s=now,
        )

    def route(self, info: RequestInfo, model: ServedModel, now: float) -> tuple[Upstream, RouteDecision]:
        upstreams = self.pool.for_model(model.name)
        decision = model.router.select(info, [u.view() for u in upstreams], now=now)
        iid = decision.instance_id
        upstream = self.pool.get(iid) if iid is not None else None
        if upstream is None:
            raise NoHealthyInstance(
                f"no healthy instance serves {model.name!r} right now",
                retry_after_s=NO_INSTANCE_RETRY_AFTER_S,
            )
        return upstream, decision

    async def forward(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        model: ServedModel,
        upstream: Upstream,
        ex: Exchange,
    ) -> web.StreamResponse:
        assert self.session is not None, "the gateway is not started"
        body = parsed.body
        body["model"] = model.served_name
        url = upstream.chat_url if parsed.endpoint == "chat" else upstream.completions_url
        resp = await open_upstream(self.session, upstream, url, _encode(body))
        clean = False
        try:
            if resp.status != 200:
                out = await rejection(resp, upstream)
                ex.outcome = OUTCOME_UPSTREAM_REJECTED
                return out
            if not parsed.stream:
                out = await relay_json(resp, ex, upstream)
                clean = True
                upstream.record_success()
                return out
            stream_out, failure = await relay_stream(request, resp, ex, upstream)
            if failure is not None:
                ex.outcome = failure.outcome
                self.pool.record_failure(upstream, failure.message)
            elif ex.outcome == OUTCOME_OK:
                clean = True
                upstream.record_success()
            return stream_out
        finally:
            if clean:
                resp.release()
            else:
                resp.close()  # closes the connection: the instance sees the client go and aborts

    # -- handlers -------------------------------------------------------------------------------
    async def completions(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        now = time.monotonic()
        ex = Exchange(now)
        model: ServedModel | None = None
        tenant: Tenant | None = None
        acquired = False
        try:
            tenant = self.authenticate(request)
            ex.tenant = tenant.name
            parsed = parse_request(await self.read_body(request), endpoint, self.limits)
            ex.stream = parsed.stream
            model = self.resolve(parsed, tenant)
            ex.model = model.name
            tenant.acquire()
            acquired = True
            info = ex.info = self.describe(parsed, model, tenant, now)
            upstream, decision = self.route(info, model, now)
            ex.reason = decision.reason.value
            model.router.on_routed(info, upstream.id, now=now)
            tokens = info.prompt_tokens + info.max_output_tokens
            upstream.begin(tokens)
            ex.upstream = upstream
            try:
                return await self.forward(request, parsed, model, upstream, ex)
            finally:
                upstream.end(tokens)
                model.router.on_finished(info, upstream.id, now=time.monotonic())
        except GatewayError as exc:
            ex.outcome = exc.outcome
            if isinstance(exc, UpstreamError) and ex.upstream is not None:
                self.pool.record_failure(ex.upstream, exc.message)
            return error_response(exc)
        except BaseException as exc:
            if not isinstance(exc, Exception):  # cancelled: the client went away
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
            self.metrics.request_done(
                ex.model, ex.tenant, ex.outcome, ex.reason, time.monotonic() - now, ex.stream
            )

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self.completions(request, "chat")

    async def text_completions(self, request: web.Request) -> web.StreamResponse:
        return await self.completions(request, "completions")

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
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def instances(self, request: web.Request) -> web.Response:
        body = {"object": "list", "data": [u.describe() for u in self.pool.all()]}
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

    async def on_startup(_: web.Application) -> None:
        await gw.start()

    async def on_cleanup(_: web.Application) -> None:
        await gw.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    routes: list[tuple[str, str, Callable[[web.Request], Awaitable[Any]]]] = [
        ("POST", "/v1/chat/completions", gw.chat_completions),
        ("POST", "/v1/completions", gw.text_completions),
        ("GET", "/v1/models", gw.models),
        ("GET", "/v1/instances", gw.instances),
        ("GET", "/health", gw.health),
        ("GET", "/metrics", gw.prometheus),
    ]
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    app.router.add_route("*", "/{tail:.*}", gw.not_found)
    return app
