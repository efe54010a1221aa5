"""Graceful drain: on SIGTERM the gateway stops being ready, refuses new requests and lets the
requests in flight (streams included) finish, up to ``drain.deadline_s``, before it exits.

Kubernetes sends SIGTERM when it deletes a pod and removes the pod from the Service's endpoints at
about the same time; a request that still arrives in between gets an OpenAI-shaped 503
(``code: "draining"``, with ``Retry-After`` and ``Connection: close``) so that clients retry on
another replica. ``/health`` and ``/health/ready`` answer 503 ``{"status": "draining"}`` at once;
``/health/live`` keeps answering 200 so that the liveness probe does not kill a pod that is only
draining. The deadline (110 s by default) stays under the manifest's 120 s
``terminationGracePeriodSeconds``: what is still running then is cancelled.

The completion routes are served by the fast front, whose handler is swapped for a refusing one;
every other route passes :meth:`Drain.middleware`, which counts aiohttp's requests in flight.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tokenplane.gateway.errors import Draining, error_response

if TYPE_CHECKING:
    from tokenplane.gateway.server import GatewayServer

log = logging.getLogger("tokenplane.gateway.drain")

DRAIN_KEY: web.AppKey[Drain] = web.AppKey("tokenplane_drain")
RETRY_AFTER_S = 1.0
POLL_S = 0.05
# Served while draining: probes, metrics and the read-only admin routes.
_ALWAYS = frozenset({"/health", "/health/ready", "/health/live", "/metrics"})


def refusal() -> web.Response:
    """The answer to a request that arrives while draining."""
    resp = error_response(Draining("the gateway is shutting down", retry_after_s=RETRY_AFTER_S))
    resp.headers["Connection"] = "close"
    return resp


class Drain:
    """Whether the gateway is draining, and aiohttp's requests in flight."""

    def __init__(self) -> None:
        self.draining = False
        self.aiohttp_in_flight = 0

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self.draining and request.path not in _ALWAYS:
            return refusal()
        self.aiohttp_in_flight += 1
        try:
            return await handler(request)
        finally:
            self.aiohttp_in_flight -= 1

    def begin(self, server: GatewayServer) -> None:
        """Stop being ready and refuse what comes next (requests already started go on)."""
        self.draining = True
        front = server.front
        if front is not None:

            async def refuse(_request: Any, _endpoint: str) -> web.StreamResponse:
                return refusal()

            front.handler = refuse

    def in_flight(self, server: GatewayServer) -> int:
        """Requests being served: the fast front's plus aiohttp's (health probes count too)."""
        n = self.aiohttp_in_flight
        if server.front is not None:
            n += sum(1 for c in server.front.connections if c.task is not None)
        return n

    async def run(self, server: GatewayServer, deadline_s: float) -> bool:
        """Drain ``server``: begin, then wait for the requests in flight to end, at most
        ``deadline_s``. True when all ended in time (the caller closes the server either way)."""
        self.begin(server)
        start = time.monotonic()
        n = self.in_flight(server)
        log.info("draining: %d request(s) in flight, deadline %.0f s", n, deadline_s)
        while n > 0:
            if time.monotonic() - start >= deadline_s:
                log.warning("drain deadline passed with %d request(s) in flight; cancelling them", n)
                return False
            await asyncio.sleep(POLL_S)
            n = self.in_flight(server)
        log.info("drained in %.1f s", time.monotonic() - start)
        return True


__all__ = ["DRAIN_KEY", "Drain", "refusal"]
