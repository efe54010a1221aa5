"""The listening gateway: the fast front for the completion routes, aiohttp's server for the rest.

``tokenplane serve`` and the tests start the gateway the same way: aiohttp's ``AppRunner`` runs the
application (start-up, clean-up, every route), and :class:`~tokenplane.gateway.edges.fast_front.FastFront`
owns the listening socket, handing connections to the runner's protocol as
:mod:`~tokenplane.gateway.edges.fast_front` describes. ``fast=False`` listens with aiohttp alone.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from yarl import URL

from tokenplane.gateway.app import GATEWAY_KEY, PIPELINE_KEY
from tokenplane.gateway.edges.fast_front import KEEPALIVE_TIMEOUT_S, FastFront
from tokenplane.gateway.fallback import served_by_header


class GatewayServer:
    def __init__(
        self,
        app: web.Application,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        fast: bool = True,
        keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S,
        reuse_port: bool = False,
    ) -> None:
        self.app = app
        self.reuse_port = reuse_port
        """Listen with ``SO_REUSEPORT`` (``tokenplane serve --workers``: several processes, one port)."""
        self.keepalive_timeout_s = keepalive_timeout_s
        self.host = host
        self.port = port
        self.fast = fast
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        self.front: FastFront | None = None
        self._server: asyncio.Server | None = None
        self._site: web.TCPSite | None = None

    async def start(self) -> None:
        await self.runner.setup()  # the application's on_startup hooks run here
        if not self.fast:
            self._site = web.TCPSite(self.runner, self.host, self.port, reuse_port=self.reuse_port or None)
            await self._site.start()
            sock = self.runner.addresses[0]
            self.port = int(sock[1])
            return
        gw = self.app[GATEWAY_KEY]
        pipeline = self.app[PIPELINE_KEY]
        server = self.runner.server
        assert server is not None
        self.front = FastFront(
            pipeline.run, server, gw.limits.max_body_bytes, served_by_header, self.keepalive_timeout_s
        )
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self.front.protocol, self.host, self.port, reuse_address=True, reuse_port=self.reuse_port or None
        )
        self.port = int(self._server.sockets[0].getsockname()[1])

    start_server = start  # the name aiohttp's TestServer uses

    def make_url(self, path: str) -> URL:
        return URL.build(scheme="http", host=self.host, port=self.port).join(URL(path))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self.front is not None:
            await self.front.close()
        await self.runner.cleanup()  # aiohttp's connections, then the on_cleanup hooks


__all__ = ["GatewayServer"]
