"""The composition root: the gateway's state, its request pipeline and its routes, from config.

A completion request (and any other ``POST /v1/*`` route passed through to the pool's runtime)
goes through these stages, in this order (:mod:`~tokenplane.gateway.stages`); a stage that the
config does not use is not in the chain:

1. respond: opens the trace; on the way out, one metrics record, the ledger's step, the trace's end;
2. authenticate: ``Authorization: Bearer`` → tenant (401);
3. parse: the body within its limit (413), validated (400), the model resolved (404);
4. response cache (when some model caches): a stored answer ends the request here;
5. fallback (when some model has a chain): move to a smaller or cheaper pool;
6. tenant limits: workflow hints, the tenant's concurrency bound (429), the request's description;
   then (when configured) shared quotas: per-minute limits, and with Redis the concurrency bound
   across replicas (429);
7. working set (when some model limits it): the KV working-set limit for tasks (429);
8. deferral (when some tenant may defer): wait for spare capacity, then batch priority;
9. admission: the pool admits, queues or refuses (429, 503);
10. disaggregate (when some model's pool is disaggregated): that model's requests run vLLM's
    prefill/decode flow over (prefill, decode) pairs (:mod:`~tokenplane.gateway.disagg.flow`);
11. forward: the core retry plan over the model's instances, one answer spliced from its attempts.

Deferral comes before admission: a deferred request waits before it takes a place in the queue.
Errors are raised as :class:`~tokenplane.gateway.errors.GatewayError` anywhere and turned into
answers by the pipeline's runner only (:mod:`~tokenplane.gateway.stages.pipeline`).
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tokenplane.gateway import openapi
from tokenplane.gateway.admin import Admin
from tokenplane.gateway.config import EdgeConfig, GatewayConfig
from tokenplane.gateway.drain import DRAIN_KEY, Drain
from tokenplane.gateway.edges.aiohttp_edge import AiohttpClient
from tokenplane.gateway.edges.guard import expect_handler
from tokenplane.gateway.fallback import SERVED_BY_HEADER, SERVED_BY_KEY
from tokenplane.gateway.keys import REVOKE_PATH, Keys
from tokenplane.gateway.openapi import OPENAPI_PATH
from tokenplane.gateway.stages.admission import Admission
from tokenplane.gateway.stages.attempt import Attempts
from tokenplane.gateway.stages.authenticate import Authenticate
from tokenplane.gateway.stages.cache import Cache
from tokenplane.gateway.stages.deferral import Deferral
from tokenplane.gateway.stages.fallback import Fallback
from tokenplane.gateway.stages.forward import Forward
from tokenplane.gateway.stages.limits import Describer, TenantLimits
from tokenplane.gateway.stages.parse import Parse
from tokenplane.gateway.stages.pipeline import Pipeline, Stage
from tokenplane.gateway.stages.quotas import Quotas, tenant_quotas
from tokenplane.gateway.stages.respond import Respond
from tokenplane.gateway.stages.tokenize import Tokenize
from tokenplane.gateway.stages.working_set import WorkingSet
from tokenplane.gateway.state import Gateway

GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("tokenplane_gateway")
PIPELINE_KEY: web.AppKey[Pipeline] = web.AppKey("tokenplane_pipeline")
EDGE_KEY: web.AppKey[EdgeConfig] = web.AppKey("tokenplane_edge")

Extra = Callable[[Gateway], "list[Stage]"]
"""Builds stages to add, in order, just before forward (see the README's "Adding a stage")."""


def build_pipeline(gw: Gateway, extra: Extra | None = None) -> Pipeline:
    """The stages in their fixed order, each given only the parts of the state it uses."""
    clock = time.monotonic
    stages: list[Stage] = [
        # the tracing read per request (it may be swapped after start-up): getattr, no Python frame
        Respond(gw.metrics, gw.path_metrics, functools.partial(getattr, gw, "tracing"), clock),
        Authenticate(gw.auth),
        Parse(gw.limits, gw.catalog),
    ]
    if gw.response_caches is not None:
        stages.append(Cache(gw.response_caches, gw.shared))
    if gw.fallbacks is not None:
        stages.append(Fallback(gw.fallbacks, gw.catalog))
    if gw.tokenizers:
        stages.append(Tokenize(gw.tokenizers))
    stages.append(TenantLimits(gw.workflows, Describer(gw.kv_events), gw.ledger_on))
    quotas = tenant_quotas(gw.tenant_configs, shared_concurrency=gw.shared is not None)
    if quotas:
        stages.append(Quotas(quotas, gw.shared, gw.metrics.registry, window_s=gw.rate_window_s))
    if gw.ws_limits:
        stages.append(
            WorkingSet(gw.working_set, gw.ws_limits, gw.kv_capacity, gw.admission_metrics, gw.retry_after)
        )
    if gw.deferral is not None:
        stages.append(Deferral(gw.deferral, gw.admission, gw.defer_always, gw.defer_allowed, gw.retry_after))
    stages.append(Admission(gw.admission, gw.retry_after, clock))
    if extra is not None:
        stages.extend(extra(gw))
    attempts = Attempts(gw.transports, gw.pool, gw.resilience, gw.path_metrics)
    if gw.disaggregated is not None:  # prefill/decode pools: their requests end here
        from tokenplane.gateway.disagg.flow import Disaggregate
        from tokenplane.gateway.disagg.prefill import Prefills

        prefills = Prefills(gw.transports, gw.pool, gw.resilience)
        pd, res, timeout_s = gw.disaggregated, gw.resilience, gw.limits.upstream_timeout_s
        stages.append(Disaggregate(pd, attempts, prefills, gw.pool, res, gw.retry_after, timeout_s))
    stages.append(Forward(attempts, gw.pool, gw.resilience, gw.retry_after, gw.limits.upstream_timeout_s))
    return Pipeline(stages, clock)


def create_app(
    config: GatewayConfig, *, rng: random.Random | None = None, extra_stages: Extra | None = None
) -> web.Application:
    """The gateway as an aiohttp application; its session and pool start and stop with the app."""
    gw = Gateway(config, rng=rng)
    pipeline = build_pipeline(gw, extra_stages)
    drain = Drain()
    admin = Admin(gw, drain)
    app = web.Application(client_max_size=config.limits.max_body_bytes, middlewares=[drain.middleware])
    app[GATEWAY_KEY] = gw
    app[DRAIN_KEY] = drain
    app[PIPELINE_KEY] = pipeline
    app[EDGE_KEY] = config.edge

    loops: list[Any] = []
    sources: list[Any] = []

    async def on_startup(_: web.Application) -> None:
        await gw.start()
        if config.autoscaling is not None and config.autoscaling.enabled:
            from tokenplane.gateway.autoscaling import build_control_loop

            loop = build_control_loop(gw, config.autoscaling)
            loop.start()
            loops.append(loop)
        if config.discovery.kind != "static":
            from tokenplane.gateway.discovery import start_discovery

            sources.append(start_discovery(gw, config.discovery, config.instances))

    async def on_cleanup(_: web.Application) -> None:
        for loop in loops:
            await loop.stop(stop_instances=True)
        for source in sources:
            await source.stop()
        await gw.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    if gw.fallbacks is not None:
        app.on_response_prepare.append(_served_by)

    async def completions(request: web.Request, endpoint: str) -> web.StreamResponse:
        return await pipeline.run(AiohttpClient(request), endpoint)

    async def passthrough(request: web.Request) -> web.StreamResponse:
        """Another ``POST /v1/*`` route: to the model's pool as it came (a gateway route's path
        with another method is still a 405)."""
        if request.path in gateway_paths:
            return await admin.not_found(request)
        return await pipeline.run(AiohttpClient(request), request.path)

    routes: list[tuple[str, str, Callable[[web.Request], Awaitable[Any]]]] = [
        ("POST", "/v1/chat/completions", functools.partial(completions, endpoint="chat")),
        ("POST", "/v1/completions", functools.partial(completions, endpoint="completions")),
        ("GET", "/v1/models", admin.models),
        ("GET", "/v1/instances", admin.instances),
        ("GET", "/health", admin.health),
        ("GET", "/health/ready", admin.health),
        ("GET", "/health/live", admin.live),
        ("GET", "/metrics", admin.prometheus),
        ("GET", "/v1/workflows/{workflow_id}", admin.workflow),
        ("POST", "/v1/workflows/{workflow_id}/outcome", admin.workflow_outcome),
        ("GET", OPENAPI_PATH, openapi.serve),
        ("POST", REVOKE_PATH, Keys(gw.auth).revoke),
    ]
    gateway_paths = frozenset(path for _, path, _ in routes if "{" not in path)
    for method, path, handler in routes:
        app.router.add_route(method, path, handler, expect_handler=expect_handler)
    app.router.add_route("POST", "/v1/{tail:.+}", passthrough, expect_handler=expect_handler)
    app.router.add_route("*", "/{tail:.*}", admin.not_found, expect_handler=expect_handler)
    return app


async def _served_by(request: web.Request, response: web.StreamResponse) -> None:
    """Name the model that served a request moved down its fallback chain."""
    served = request.get(SERVED_BY_KEY)
    if served is not None:
        response.headers[SERVED_BY_HEADER] = served


__all__ = ["GATEWAY_KEY", "PIPELINE_KEY", "Gateway", "build_pipeline", "create_app"]
