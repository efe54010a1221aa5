"""The admin routes: models, instances, health, metrics, workflows; and the OpenAI error shape for
routes that do not exist. They read the gateway's state; none is on the completion path."""

from __future__ import annotations

import time

import msgspec
from aiohttp import web

from tokenplane.gateway.drain import Drain
from tokenplane.gateway.edges.aiohttp_edge import AiohttpClient
from tokenplane.gateway.errors import GatewayError, MethodNotAllowed, RouteNotFound, error_response
from tokenplane.gateway.metrics import CONTENT_TYPE
from tokenplane.gateway.state import Gateway

_encode = msgspec.json.Encoder().encode


async def _read_body(request: web.Request, limit: int) -> bytes:
    client = AiohttpClient(request)
    data = client.body_now(limit)
    return data if data is not None else await client.read_body(limit)


class Admin:
    """The admin handlers over one gateway's state."""

    def __init__(self, gw: Gateway, drain: Drain | None = None) -> None:
        self.gw = gw
        self.drain = drain

    async def models(self, request: web.Request) -> web.Response:
        try:
            tenant = self.gw.auth.authenticate(request.headers.get("Authorization"))
        except GatewayError as exc:
            return error_response(exc)
        return web.Response(body=self.gw.catalog.listing(tenant), content_type="application/json")

    async def health(self, request: web.Request) -> web.Response:
        """Readiness (``/health``, ``/health/ready``): 503 ``draining`` once SIGTERM arrived."""
        ups = self.gw.pool.all()
        healthy = sum(1 for u in ups if u.healthy)
        draining = self.drain is not None and self.drain.draining
        body = {
            "status": "draining" if draining else "ok",
            "instances": len(ups),
            "healthy_instances": healthy,
        }
        status = 503 if draining else 200
        return web.Response(status=status, body=_encode(body), content_type="application/json")

    async def live(self, request: web.Request) -> web.Response:
        """Liveness (``/health/live``): 200 while the process serves, draining or not."""
        return web.Response(body=_encode({"status": "alive"}), content_type="application/json")

    async def prometheus(self, request: web.Request) -> web.Response:
        await self.gw.workflows.refresh()
        return web.Response(body=self.gw.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def workflow(self, request: web.Request) -> web.Response:
        try:
            tenant = self.gw.auth.authenticate(request.headers.get("Authorization"))
            return await self.gw.workflows.show(request.match_info["workflow_id"], tenant)
        except GatewayError as exc:
            return error_response(exc)

    async def workflow_outcome(self, request: web.Request) -> web.Response:
        try:
            tenant = self.gw.auth.authenticate(request.headers.get("Authorization"))
            raw = await _read_body(request, self.gw.limits.max_body_bytes)
            workflow_id = request.match_info["workflow_id"]
            out = await self.gw.workflows.set_outcome(workflow_id, tenant, raw)
            if out.status == 200:
                for model in self.gw.ws_limits:
                    self.gw.working_set.drop(model, tenant.name, workflow_id)
            return out
        except GatewayError as exc:
            return error_response(exc)

    async def instances(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        data = []
        for u in self.gw.pool.all():
            d = u.describe()
            d["breaker"] = self.gw.resilience.state(u.id, now).value
            data.append(d)
        body = {"object": "list", "data": data}
        return web.Response(body=_encode(body), content_type="application/json")

    async def not_found(self, request: web.Request) -> web.Response:
        known = {r.resource.canonical for r in request.app.router.routes() if r.resource is not None}
        if request.path in known:
            return error_response(MethodNotAllowed(f"{request.method} is not allowed on {request.path}"))
        return error_response(RouteNotFound(f"no route {request.method} {request.path}"))
